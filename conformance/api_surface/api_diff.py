"""``kvconform api-diff A B``: what a connector author must know moved between two vLLM releases.

Lines read ``+ added``, ``- removed``, ``~ changed`` (followed by ``was:``/``now:``), grouped by
section, so a reviewer can read the layout story from 0.19 to 0.32 without opening either tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

from conformance.api_surface.fingerprint import ClassEntry, DefEntry, Field, Fingerprint, Place, Registered

NO_DIFFERENCES = "no differences"


@dataclass(frozen=True)
class Section:
    title: str
    lines: tuple[str, ...]


def signature(entry: DefEntry) -> str:
    """A def's entry as Python would print it: ``classmethod (cls, x: int = 1) -> str``, ``[abstract]``."""
    parts, star_done = [], False
    for i, p in enumerate(entry["params"]):
        kind = p["kind"]
        if kind == "keyword_only" and not star_done:
            parts.append("*")
        star_done = star_done or kind in ("var_positional", "keyword_only")
        text = {"var_positional": "*", "var_keyword": "**"}.get(kind, "") + p["name"]
        text += f": {p['annotation']}" if p["annotation"] else ""
        text += (" = " if p["annotation"] else "=") + p["default"] if p["default"] else ""
        parts.append(text)
        following = entry["params"][i + 1]["kind"] if i + 1 < len(entry["params"]) else None
        if kind == "positional_only" and following != "positional_only":
            parts.append("/")
    kind = "" if entry["kind"] in ("method", "function") else entry["kind"] + " "
    returns = f" -> {entry['returns']}" if entry.get("returns") else ""
    abstract = " [abstract]" if entry.get("abstract") else ""
    return f"{kind}({', '.join(parts)}){returns}{abstract}"


def _signature_alone(entry: DefEntry) -> str:
    """A def's signature without its abstractness (the abstract set is a section of its own)."""
    return signature({**entry, "abstract": False})


def keyed(old: Mapping[str, Any], new: Mapping[str, Any], show: Callable[[Any], str] = str) -> list[str]:
    """``+``/``-``/``~`` lines for two mappings, by key, with each value shown by ``show``."""
    lines = []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            lines.append(f"- {key}: {show(old[key])}")
        elif key not in old:
            lines.append(f"+ {key}: {show(new[key])}")
        elif show(old[key]) != show(new[key]):
            lines += [f"~ {key}", f"    was: {show(old[key])}", f"    now: {show(new[key])}"]
    return lines


def _moved(what: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return [] if old.get("module") == new.get("module") else [f"~ {what} moved", f"    was: {old.get('module')}",
                                                               f"    now: {new.get('module')}"]


def _connector(a: Fingerprint, b: Fingerprint) -> list[Section]:
    old, new = a["connector"]["methods"], b["connector"]["methods"]
    common = set(old) & set(new)
    abstract = [{n for n, e in side.items() if e["abstract"]} for side in (old, new)]
    return [
        Section(f"connector methods ({b['connector']['class']})", tuple(
            _moved(a["connector"]["class"], a["connector"], b["connector"])
            + keyed({k: old[k] for k in set(old) - common}, {k: new[k] for k in set(new) - common}, signature))),
        Section("signatures", tuple(keyed({k: old[k] for k in common}, {k: new[k] for k in common},
                                          _signature_alone))),
        Section("abstract set", tuple([f"- {n}" for n in sorted(abstract[0] - abstract[1])]
                                      + [f"+ {n}" for n in sorted(abstract[1] - abstract[0])])),
        Section("KVConnectorRole", tuple(_moved("KVConnectorRole", a["connector"]["role"], b["connector"]["role"])
                                         + keyed(a["connector"]["role"]["members"], b["connector"]["role"]["members"]))),
    ]


def _field(entry: Field) -> str:
    return f"{entry['annotation']}" + (f" = {entry['default']}" if entry["default"] else "")


def _connector_class(entry: Registered) -> str:
    return f"{entry['module']}.{entry['class']}"


def _place(place: Place) -> str:
    if place["kind"] == "class":
        cls = cast(ClassEntry, place)
        members = ", ".join(f"{k}={v}" for k, v in cls["members"].items())
        return f"class({', '.join(cls['bases'])})" + (f" {{{members}}}" if members else "")
    return signature(cast(DefEntry, place))


def _places(section: dict[str, list[Place]]) -> dict[str, Place]:
    return {f"{p['module']}.{p['qualname']}": p for places in section.values() for p in places}


def _layout(a: Fingerprint, b: Fingerprint) -> list[str]:
    old, new = a["layout_api"], b["layout_api"]
    summary = [f"- {n}: no definition left" for n in sorted(old) if old[n] and not new.get(n)]
    summary += [f"+ {n}: now defined" for n in sorted(new) if new[n] and not old.get(n)]
    return summary + keyed(_places(old), _places(new), _place)


def _backend_method(entry: DefEntry) -> str:
    returns = entry.get("return_exprs")
    said = " | ".join(returns) if returns else ("..." if returns is None else "nothing")
    return f"{signature(entry)}; returns {said}"


def _flat_backends(fp: Fingerprint) -> dict[str, DefEntry]:
    return {f"{key}.{name}": entry for key, methods in fp["backends"].items() for name, entry in methods.items()}


def _exports(a: Fingerprint, b: Fingerprint) -> list[str]:
    """Indexed modules that are gone or new, and names an indexed module no longer binds."""
    old, new = a["exports"]["modules"], b["exports"]["modules"]
    lines = [f"- module {m}" for m in sorted(set(old) - set(b["exports"]["all_modules"]))]
    lines += [f"+ module {m}" for m in sorted(set(new) - set(a["exports"]["all_modules"]))]
    for module in sorted(set(old) & set(new)):
        gone = sorted(set(old[module]) - set(new[module]))
        if gone:
            lines.append(f"~ {module}: no longer binds {', '.join(gone)}")
    return lines


def compare(a: Fingerprint, b: Fingerprint) -> list[Section]:
    """The sections in a fixed order; a section with no lines did not change."""
    return [
        *_connector(a, b),
        Section("KVTransferConfig", tuple(_moved("KVTransferConfig", a["kv_transfer_config"], b["kv_transfer_config"])
                                          + keyed(a["kv_transfer_config"]["fields"], b["kv_transfer_config"]["fields"],
                                                  _field))),
        Section("registry (KVConnectorFactory)", tuple(keyed(a["registry"]["connectors"], b["registry"]["connectors"],
                                                             _connector_class))),
        Section("dtype map (STR_DTYPE_TO_TORCH_DTYPE)", tuple(
            _moved("STR_DTYPE_TO_TORCH_DTYPE", a["dtype_map"], b["dtype_map"])
            + keyed(a["dtype_map"]["entries"], b["dtype_map"]["entries"]))),
        Section("CacheDType", tuple(_moved("CacheDType", a["cache_dtype"], b["cache_dtype"])
                                    + [f"- {v}" for v in a["cache_dtype"]["values"] if v not in b["cache_dtype"]["values"]]
                                    + [f"+ {v}" for v in b["cache_dtype"]["values"] if v not in a["cache_dtype"]["values"]])),
        Section("layout API", tuple(_layout(a, b))),
        Section("backends", tuple(keyed(_flat_backends(a), _flat_backends(b), _backend_method))),
        Section("exports", tuple(_exports(a, b))),
    ]


def render(a: Fingerprint, b: Fingerprint) -> str:
    sections = [s for s in compare(a, b) if s.lines]
    head = f"vLLM {a['vllm_version']} -> {b['vllm_version']}"
    if not sections:
        return f"{head}: {NO_DIFFERENCES}\n"
    body = "".join(f"\n## {s.title}\n" + "".join(line + "\n" for line in s.lines) for s in sections)
    return head + "\n" + body
