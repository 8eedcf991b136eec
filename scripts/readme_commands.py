"""The README's two newcomer commands, word for word: what .ci/run and the fresh-machine tests run,
so that what a newcomer is told is what CI proves on a fresh machine.

    python3 scripts/readme_commands.py main    # 1. the main job: the quick tier and its report
    python3 scripts/readme_commands.py tests   # 2. the suite's own tests

Standard library only: it runs in a Python that has nothing installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Newcomer commands"
NUMBERS = {"main": "1", "tests": "2"}


def commands(text: str) -> dict[str, str]:
    """{main, tests} -> the command under ``# 1.`` and ``# 2.`` in the first code block of SECTION."""
    if SECTION not in text:
        raise ValueError(f"README.md has no {SECTION!r} section")
    block = re.search(r"^```bash\n(.*?)^```", text.split(SECTION, 1)[1], re.M | re.S)
    if block is None:
        raise ValueError(f"README.md's {SECTION!r} section has no ```bash block")
    lines = block.group(1).splitlines()
    found = {}
    for name, number in NUMBERS.items():
        at = [i for i, line in enumerate(lines) if line.startswith(f"# {number}.")]
        if not at or at[0] + 1 >= len(lines) or not lines[at[0] + 1].strip():
            raise ValueError(f"README.md's {SECTION!r} block has no command under '# {number}.'")
        found[name] = lines[at[0] + 1].strip()
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in NUMBERS:
        print(f"usage: readme_commands.py {{{','.join(NUMBERS)}}}", file=sys.stderr)
        return 2
    try:
        print(commands(README.read_text(encoding="utf-8"))[argv[0]])
    except ValueError as exc:
        print(f"readme_commands: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
