"""An agent-like workload: sessions that resend their context every turn and files that come back edited.

Each session works on one source file: turn 1 sends a fixed system prompt, the file (as a tool result) and a
task; turn 2 resends all of turn 1, the model's answer, and the file again with one line edited (an agent
re-reading the file after a change). Sessions share the system prompt, and pairs of sessions share their file,
so both the request's own context (prompt lookup's source) and earlier requests (suffix decoding's global
tree) hold text the model is about to write. Byte-level, from the course's corpus; seeded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from specdec.models import corpus

SYSTEM = "# agent: you edit Python files with the tools read_file and edit_file.\n"


@dataclass(frozen=True)
class Turn:
    """One request of a session: its prompt is every earlier turn's text and answer, then ``text``."""

    session: int
    turn: int
    text: str


def agent_sessions(n_sessions: int = 8, file_bytes: int = 96, seed: int = 0) -> list[list[Turn]]:
    """``n_sessions`` two-turn sessions; sessions 2k and 2k + 1 work on the same file."""
    rng = random.Random(seed)
    files = corpus.code_prompts(n_sessions // 2 + 1, length=file_bytes)
    sessions = []
    for s in range(n_sessions):
        text = files[s // 2]
        lines = text.split("\n")
        k = rng.randrange(len(lines))
        edited = "\n".join(lines[:k] + [lines[k].replace("self", "obj").replace("_", "") + "  # edited"] + lines[k + 1:])
        first = f"{SYSTEM}>>> read_file('mod{s // 2}.py')\n{text}\n# task {s}: continue this file\n"
        second = f"\n>>> edit_file('mod{s // 2}.py', line={k})\n>>> read_file('mod{s // 2}.py')\n{edited}\n# continue\n"
        sessions.append([Turn(s, 1, first), Turn(s, 2, second)])
    return sessions
