"""vLLM API fingerprints: the static reader, api-diff, api-requirements; the engine-marked ones check
the installed vLLM (import mode equals static, and equals its committed fingerprint)."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conformance.api_surface import SCHEMA, api_diff, fingerprint, requirements, sources, static

from tests.conftest import REPO

API = REPO / "conformance" / "data" / "api"
ZOO = REPO / "conformance" / "zoo" / "connectors"
VERSIONS = ("0.8.5", "0.9.2", "0.10.2", "0.11.0", "0.12.0", "0.13.0", "0.16.0", "0.19.1", "0.22.0", "0.25.0",
            "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")

TINY = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '9.9.9'\n",
    "vllm/connector/base.py": '''
import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vllm.config import VllmConfig

class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1

class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config=None):
        self._role = role

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs) -> None: ...

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> str | None:
        return None

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    def request_finished(self, request, /, block_ids: list[int], *, delay: bool = False) -> tuple[bool, dict | None]:
        return False, None
''',
    "vllm/connector/factory.py": '''
class KVConnectorFactory:
    @classmethod
    def register_connector(cls, name, module_path, class_name): ...

KVConnectorFactory.register_connector("TinyConnector", "vllm.connector.tiny", "TinyConnector")
KVConnectorFactory.register_connector(name="Other", module_path="vllm.connector.other", class_name="Other")
''',
    "vllm/config.py": '''
from typing import Literal
CacheDType = Literal["auto", "fp8", "fp8_e5m2"]

class KVTransferConfig:
    kv_connector: str | None = None
    kv_port: int = 14579
    kv_connector_extra_config: dict = field(default_factory=dict)
''',
    "vllm/utils.py": '''
import torch
STR_DTYPE_TO_TORCH_DTYPE = {"half": torch.half, "fp8_e5m2": torch.uint8}
def get_kv_cache_layout():
    return "NHD"
''',
    "vllm/v1/attention/backends/flash.py": '''
class FlashBackend:
    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)
''',
}


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    for name, text in TINY.items():
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "src"


def committed(version: str) -> fingerprint.Fingerprint:
    return fingerprint.load(fingerprint.committed_path(version, API))


def kvconform(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], capture_output=True, text=True, cwd=REPO)


def test_static_reader_on_a_tiny_tree(tiny):
    fp = static.fingerprint(sources.read(tiny))
    assert (fp["schema"], fp["vllm_version"], fp["obtained_by"]) == (SCHEMA, "9.9.9", "static")
    methods = fp["connector"]["methods"]
    assert fp["connector"]["module"] == "vllm.connector.base"
    assert {n for n, m in methods.items() if m["abstract"]} == {"start_load_kv"}
    assert methods["get_required_kvcache_layout"]["kind"] == "classmethod"
    assert methods["prefer_cross_layer_blocks"]["kind"] == "property"
    assert api_diff.signature(methods["request_finished"]) == (
        "(self, request, /, block_ids: list[int], *, delay: bool = False) -> tuple[bool, dict | None]")
    assert api_diff.signature(methods["__init__"]) == (
        "(self, vllm_config: 'VllmConfig', role: KVConnectorRole, kv_cache_config=None)")
    assert fp["connector"]["role"]["members"] == {"SCHEDULER": "0", "WORKER": "1"}
    assert fp["kv_transfer_config"]["fields"]["kv_port"] == {"annotation": "int", "default": "14579"}
    assert fp["registry"]["connectors"] == {"TinyConnector": {"module": "vllm.connector.tiny", "class": "TinyConnector"},
                                            "Other": {"module": "vllm.connector.other", "class": "Other"}}
    assert fp["dtype_map"] == {"module": "vllm.utils", "name": "STR_DTYPE_TO_TORCH_DTYPE",
                               "entries": {"half": "torch.float16", "fp8_e5m2": "torch.uint8"}}
    assert fp["cache_dtype"] == {"module": "vllm.config", "values": ["auto", "fp8", "fp8_e5m2"]}
    assert [p["module"] for p in fp["layout_api"]["get_kv_cache_layout"]] == ["vllm.utils"]
    assert fp["layout_api"]["KVCacheLayout"] == []
    shape = fp["backends"]["vllm.v1.attention.backends.flash:FlashBackend"]["get_kv_cache_shape"]
    assert shape["kind"] == "staticmethod" and shape["return_exprs"] == ["(2, num_blocks, block_size, num_kv_heads, head_size)"]
    assert "vllm.v1.attention.backends.flash" in fp["exports"]["all_modules"]


def test_archives_read_like_the_tree(tiny, tmp_path):
    """An sdist nests the package under ``vllm-X/``; a wheel does not. Both read as the directory does."""
    sdist, wheel = tmp_path / "vllm-9.9.9.tar.gz", tmp_path / "vllm-9.9.9-py3-none-any.whl"
    with tarfile.open(sdist, "w:gz") as tf:
        for name, text in TINY.items():
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            info.size = len(text.encode())
            tf.addfile(info, io.BytesIO(text.encode()))
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in TINY.items():
            zf.writestr(name, text)
    expected = fingerprint.surface(static.fingerprint(sources.read(tiny)))
    for archive in (sdist, wheel):
        fp = static.fingerprint(sources.read(archive))
        assert fingerprint.surface(fp) == expected
        assert fp["source"]["filename"] == archive.name and len(fp["source"]["sha256"]) == 64


def test_api_fingerprint_from_a_tree_writes_a_loadable_file(tiny, tmp_path):
    out = tmp_path / "fp.json"
    proc = kvconform("api-fingerprint", "--from", str(tiny), "--out", str(out))
    assert proc.returncode == 0 and "vLLM 9.9.9 (static) written to" in proc.stdout
    assert fingerprint.load(out)["registry"]["connectors"]["TinyConnector"]["class"] == "TinyConnector"
    assert out.read_text() == fingerprint.dumps(fingerprint.load(out))  # sorted keys: stable bytes


def test_no_vllm_there_is_one_line(tmp_path):
    with pytest.raises(sources.SourceError, match="no vllm package here"):
        sources.read(tmp_path)
    proc = kvconform("api-fingerprint", "--from", str(tmp_path / "nope.tar.gz"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no such file" in proc.stderr


def test_committed_fingerprints_are_complete_and_read_from_sdists():
    fps = fingerprint.committed(API)
    assert [fp["vllm_version"] for fp in fps] == list(VERSIONS)
    for fp in fps:
        assert fp["obtained_by"] == "static"
        assert fp["source"]["filename"] == f"vllm-{fp['vllm_version']}.tar.gz" and len(fp["source"]["sha256"]) == 64
        assert fp["connector"]["methods"] and fp["registry"]["connectors"] and fp["dtype_map"]["entries"]
        assert fp["dtype_map"]["entries"]["fp8_e5m2"] == "torch.uint8"


def test_api_diff_0_19_1_to_0_32_0_tells_the_layout_story():
    proc = kvconform("api-diff", str(API / "vllm-0.19.1.json"), str(API / "vllm-0.32.0.json"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "vLLM 0.19.1 -> 0.32.0"
    for expected in [
        "## layout API",
        "- get_kv_cache_layout: no definition left",
        "+ KVCacheLayout: now defined",
        "+ resolve_kv_cache_layout: now defined",
        "- vllm.v1.attention.backends.utils.set_kv_cache_layout: (cache_layout: KVCacheLayoutType | None)",
        "+ vllm.v1.kv_cache_layout.KVCacheLayout: class(Enum) {BHLNC=(1, 2, 0, 3, 4), BLHNC=(1, 0, 2, 3, 4), "
        "BLNHC=(1, 0, 3, 2, 4), LBHNC=(0, 1, 2, 3, 4), LBNHC=(0, 1, 3, 2, 4), LHBNC=(0, 2, 1, 3, 4)}",
        "- vllm.v1.attention.backends.flash_attn:FlashAttentionBackend.get_kv_cache_shape: staticmethod "
        "(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = 'auto') "
        "-> tuple[int, ...]; returns (2, num_blocks, block_size, num_kv_heads, head_size)",
        "+ vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend.supported_kv_cache_layouts: classmethod "
        "(cls) -> tuple[KVCacheLayout, ...]; returns (KVCacheLayout.LBHNC,)",
        "## signatures",
        "~ __init__",
        "    was: (self, vllm_config: 'VllmConfig', role: KVConnectorRole, kv_cache_config: 'KVCacheConfig | None' = None)",
        "    now: (self, vllm_config: 'VllmConfig', role: KVConnectorRole, kv_cache_config: 'KVCacheConfig')",
        "- register_cross_layers_kv_cache: (self, kv_cache: torch.Tensor, attn_backend: type['AttentionBackend'])",
        "- P2pNcclConnector: vllm.distributed.kv_transfer.kv_connector.v1.p2p.p2p_nccl_connector.P2pNcclConnector",
        "- kv_buffer_size: float = 1000000000.0",
    ]:
        assert expected in lines, f"{expected!r} not in:\n{proc.stdout}"


def test_api_diff_shows_the_shared_storage_rename_in_0_13():
    text = api_diff.render(committed("0.12.0"), committed("0.13.0"))
    assert ("- SharedStorageConnector: vllm.distributed.kv_transfer.kv_connector.v1.shared_storage_connector."
            "SharedStorageConnector") in text.splitlines()
    assert "+ ExampleConnector: vllm.distributed.kv_transfer.kv_connector.v1.example_connector.ExampleConnector" in text


def test_api_diff_of_a_file_with_itself():
    proc = kvconform("api-diff", str(API / "vllm-0.32.0.json"), str(API / "vllm-0.32.0.json"))
    assert (proc.returncode, proc.stdout) == (0, "vLLM 0.32.0 -> 0.32.0: no differences\n")


@pytest.mark.parametrize("text, says", [
    ("{", "not valid JSON"),
    ('{"schema": "kvconform.matrix/1"}', "schema: expected 'kvconform.api-fingerprint/1', got 'kvconform.matrix/1'"),
    ('{"schema": "kvconform.api-fingerprint/1", "vllm_version": "1"}', "missing section 'connector'"),
])
def test_api_diff_of_an_invalid_file_is_one_line(tmp_path, text, says):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    proc = kvconform("api-diff", str(API / "vllm-0.32.0.json"), str(bad))
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert says in proc.stderr and str(bad) in proc.stderr


def test_stale_layout_connector_is_flagged_with_last_seen_version():
    missing = requirements.check_requirements(ZOO / "stale_layout_api.py", committed("0.32.0"))
    assert [str(m) for m in missing] == [
        "`get_kv_cache_layout` from vllm.v1.attention.backends.utils: not in vLLM 0.32.0 (last seen in 0.28.0, gone from 0.29.0)",
        "`set_kv_cache_layout` from vllm.v1.attention.backends.utils: not in vLLM 0.32.0 (last seen in 0.28.0, gone from 0.29.0)",
        "overrides `KVConnectorBase_V1.register_cross_layers_kv_cache` of vllm.distributed.kv_transfer.kv_connector.v1.base:"
        " not in vLLM 0.32.0 (last seen in 0.28.0, gone from 0.29.0)",
        "calls `KVConnectorBase_V1.register_cross_layers_kv_cache` of vllm.distributed.kv_transfer.kv_connector.v1.base:"
        " not in vLLM 0.32.0 (last seen in 0.28.0, gone from 0.29.0)",
    ]
    assert requirements.check_requirements(ZOO / "stale_layout_api.py", committed("0.19.1")) == []
    proc = kvconform("api-requirements", str(ZOO / "stale_layout_api.py"), "--fingerprint", str(API / "vllm-0.32.0.json"))
    assert proc.returncode == 1
    assert f"{ZOO / 'stale_layout_api.py'}:10: `get_kv_cache_layout` from vllm.v1.attention.backends.utils" in proc.stdout


def test_layout_aware_connector_passes_on_0_32_and_not_before_0_29():
    assert requirements.check_requirements(ZOO / "layout_aware.py", committed("0.32.0")) == []
    assert [str(m) for m in requirements.check_requirements(ZOO / "layout_aware.py", committed("0.28.0"))] == [
        "module vllm.v1.kv_cache_layout: not in vLLM 0.28.0 (in no committed release before it)"]
    proc = kvconform("api-requirements", str(ZOO / "layout_aware.py"), "--fingerprint", str(API / "vllm-0.32.0.json"))
    assert proc.returncode == 0 and "vLLM 0.32.0: 0 missing" in proc.stdout


def test_guarded_and_type_checking_imports_are_not_requirements(tmp_path):
    src = tmp_path / "compat.py"
    src.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from vllm.gone import Ghost\n"
                   "try:\n    from vllm.v1.attention.backends.utils import get_kv_cache_layout\n"
                   "except ImportError:\n    get_kv_cache_layout = None\n"
                   "from vllm.v1.kv_cache_layout import KVCacheLayout\n")
    assert [(r.module, r.name) for r in requirements.scan(src)] == [("vllm.v1.kv_cache_layout", "KVCacheLayout")]


@pytest.mark.engine
def test_import_mode_equals_static_reading_of_the_installed_vllm():
    vllm = pytest.importorskip("vllm")
    from conformance.api_surface import runtime

    imported = runtime.fingerprint()
    read = static.fingerprint(sources.read(Path(vllm.__file__).parent, version=vllm.__version__))
    assert imported["obtained_by"] == "import"
    assert {**imported, "obtained_by": "static"} == read, api_diff.render(read, imported)


@pytest.mark.engine
def test_installed_vllm_matches_its_committed_fingerprint():
    vllm = pytest.importorskip("vllm")
    from conformance.api_surface import runtime

    path = fingerprint.committed_path(vllm.__version__, API)
    if not path.exists():
        pytest.skip(f"no committed fingerprint for vLLM {vllm.__version__}: run scripts/refresh_api_fingerprints.py")
    installed, expected = runtime.fingerprint(), fingerprint.load(path)
    assert fingerprint.surface(installed) == fingerprint.surface(expected), (
        f"installed vLLM {vllm.__version__} differs from {path}:\n{api_diff.render(expected, installed)}")


@pytest.mark.engine
def test_vllms_own_example_connector_needs_nothing_missing():
    pytest.importorskip("vllm")
    module = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"
    assert requirements.check_requirements(module, committed("0.32.0")) == []
    assert requirements.check_requirements(module) == []  # against the installed vLLM, by import
    proc = kvconform("api-requirements", str(ZOO / "stale_layout_api.py"))
    assert proc.returncode == 1 and "last seen in 0.28.0" in proc.stdout


def test_a_connectors_code_is_followed_through_wrappers_without_importing_it(tmp_path, monkeypatch):
    """A re-export, an alias and a subclass each lead to the module the code is in; vLLM ends the walk."""
    from conformance.api_surface.requirements import connector_modules

    pkg = tmp_path / "wpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text("from vllm.x import Base\n\nclass Real(Base):\n    pass\n")
    (pkg / "shim.py").write_text("from wpkg.core import Real as Connector\n")
    (pkg / "sub.py").write_text("from .shim import Connector\n\nclass Wrapped(Connector):\n    pass\n\nAlias = Wrapped\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert connector_modules("wpkg.sub", "Alias") == ["wpkg.sub", "wpkg.shim", "wpkg.core"]
    assert connector_modules("wpkg.core", "Real") == ["wpkg.core"]
    assert connector_modules("wpkg.core", "Absent") == ["wpkg.core"]
