"""Notebook 13, structured output with speculation: a grammar over the byte tokenizer, and drafts checked
against it.

The grammar is a regular expression compiled to a state machine over bytes (the course's token ids).
A :class:`Matcher` follows one request through it, with the calls a serving engine makes (vLLM V1's
``StructuredOutputGrammar`` in ``vllm/v1/structured_output/backend_types.py`` has the same four):
``accept(tokens)`` advances, ``validate(tokens)`` says how long a prefix is allowed without advancing,
``rollback(n)`` undoes the last n accepted tokens, and ``allowed()`` is the (V,) mask of the next token.

Constrained sampling draws each token from the target's logits with the tokens ``allowed()`` forbids set to
-inf (p masked and renormalised, before temperature, top-k and top-p act; the argmax of what is allowed when
greedy). A speculative round keeps that distribution exactly (notebook 13's exercise, :func:`constrained_round`):

1. cut the drafts after the first one the grammar forbids (the target need not look past it);
2. advance the matcher over the allowed drafts to get one mask per speculative position, then roll it
   back: the drafts are not committed yet;
3. verify with every position's logits masked by its mask. A forbidden draft has masked p' of 0, so it is
   rejected for certain, and the correction comes from the residual max(p' - q, 0), as after any
   rejection. Dropping the forbidden draft and sampling from p' instead is biased whenever q put mass on
   forbidden tokens (a drafter that ignores the grammar); it is exact only for one-hot drafts (prompt
   lookup, suffix decoding, greedy drafts), where the two agree;
4. advance the matcher over the committed tokens only (never past the grammar's end).

vLLM cuts drafts with ``validate_tokens`` when the scheduler receives them, fills one bitmask row per
speculative position (and one for the bonus) by accepting each draft and then calling
``rollback(state_advancements)`` (``grammar_bitmask`` in ``vllm/v1/structured_output/__init__.py``), and
accepts the committed tokens after the rejection sampler has run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.chain import verify_drafts
from specdec.engine import rollback
from specdec.models.model import KVCache, Llama
from specdec.models.tokenizer import VOCAB_SIZE
from specdec.params import GREEDY, SamplingParams, check_request
from specdec.sampling import sample

_CLASSES = {"d": set(b"0123456789"), "w": set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"),
            "s": set(b" \t\n")}


@dataclass
class _Nfa:
    """Thompson's construction: node i has byte edges ``edges[i]`` (set of bytes, target) and empty moves."""

    edges: list[list[tuple[frozenset[int], int]]] = field(default_factory=list)
    empty: list[list[int]] = field(default_factory=list)

    def node(self) -> int:
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1


class _Parser:
    """pattern := branch ('|' branch)*; branch := (atom quantifier?)*; atom := byte | [class] | . | \\x | (pattern)."""

    def __init__(self, pattern: str, nfa: _Nfa) -> None:
        self.text, self.at, self.nfa = pattern.encode("utf-8"), 0, nfa

    def error(self, what: str) -> ValueError:
        return ValueError(f"grammar pattern {self.text.decode()!r}: {what} at offset {self.at}")

    def peek(self) -> int | None:
        return self.text[self.at] if self.at < len(self.text) else None

    def pattern(self) -> tuple[int, int]:
        start, end = self.branch()
        while self.peek() == ord("|"):
            self.at += 1
            s2, e2 = self.branch()
            s, e = self.nfa.node(), self.nfa.node()
            self.nfa.empty[s] += [start, s2]
            self.nfa.empty[end].append(e)
            self.nfa.empty[e2].append(e)
            start, end = s, e
        return start, end

    def branch(self) -> tuple[int, int]:
        start = end = self.nfa.node()
        while self.peek() is not None and self.peek() not in b"|)":
            s, e = self.quantified()
            self.nfa.empty[end].append(s)
            end = e
        return start, end

    def quantified(self) -> tuple[int, int]:
        s, e = self.atom()
        q = self.peek()
        if q is not None and q in b"*+?":
            self.at += 1
            start, end = self.nfa.node(), self.nfa.node()
            self.nfa.empty[start].append(s)
            self.nfa.empty[e].append(end)
            if q in b"*?":
                self.nfa.empty[start].append(end)
            if q in b"*+":
                self.nfa.empty[e].append(s)
            return start, end
        return s, e

    def atom(self) -> tuple[int, int]:
        c = self.peek()
        if c is None or c in b"*+?":
            raise self.error("expected a character, a class or a group")
        self.at += 1
        if c == ord("("):
            s, e = self.pattern()
            if self.peek() != ord(")"):
                raise self.error("unclosed group")
            self.at += 1
            return s, e
        if c == ord("["):
            chars = self.char_class()
        elif c == ord("."):
            chars = set(range(VOCAB_SIZE)) - {ord("\n")}
        elif c == ord("\\"):
            chars = self.escape()
        else:
            chars = {c}
        s, e = self.nfa.node(), self.nfa.node()
        self.nfa.edges[s].append((frozenset(chars), e))
        return s, e

    def escape(self) -> set[int]:
        c = self.peek()
        if c is None:
            raise self.error("pattern ends with a backslash")
        self.at += 1
        return set(_CLASSES.get(chr(c), {ord("\n")} if c == ord("n") else {c}))

    def char_class(self) -> set[int]:
        negate = self.peek() == ord("^")
        self.at += negate
        chars: set[int] = set()
        while self.peek() != ord("]"):
            if self.peek() is None:
                raise self.error("unclosed [class]")
            c = self.text[self.at]
            self.at += 1
            if c == ord("\\"):
                chars |= self.escape()
            elif self.peek() == ord("-") and self.at + 1 < len(self.text) and self.text[self.at + 1] != ord("]"):
                chars |= set(range(c, self.text[self.at + 1] + 1))
                self.at += 2
            else:
                chars.add(c)
        self.at += 1
        return set(range(VOCAB_SIZE)) - chars if negate else chars


class Grammar:
    """A regular expression over bytes as a state machine: states are ints, 0 the start.

    Syntax: literal bytes, ``.``, ``[a-z_]`` and ``[^...]``, ``\\d \\w \\s \\n`` and escaped literals,
    ``( | )`` and the quantifiers ``* + ?``. The whole output must match; generation under the grammar
    ends when no token is allowed. ``vocab_size``: the ids a mask covers (256 for the byte tokenizer;
    a smaller toy vocabulary's ids are the bytes 0..V-1)."""

    def __init__(self, pattern: str, vocab_size: int = VOCAB_SIZE) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"a grammar pattern must be a non-empty str, got {pattern!r}")
        self.vocab_size = vocab_size
        nfa = _Nfa()
        parser = _Parser(pattern, nfa)
        start, self._accept = parser.pattern()
        if parser.peek() is not None:
            raise parser.error("unbalanced ')'")
        self._nfa, self.pattern = nfa, pattern
        self._sets: list[frozenset[int]] = [self._closure({start})]
        self._ids = {self._sets[0]: 0}
        self._next: dict[tuple[int, int], int] = {}
        self._masks: dict[int, torch.Tensor] = {}

    def _closure(self, nodes: set[int]) -> frozenset[int]:
        todo, seen = list(nodes), set(nodes)
        while todo:
            for n in self._nfa.empty[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return frozenset(seen)

    def step(self, state: int, token: int) -> int:
        """The state after ``token``, or -1 if the grammar forbids it."""
        key = (state, int(token))
        if key not in self._next:
            moved = {to for n in self._sets[state] for chars, to in self._nfa.edges[n] if token in chars}
            if not moved:
                self._next[key] = -1
            else:
                closed = self._closure(moved)
                if closed not in self._ids:
                    self._ids[closed] = len(self._sets)
                    self._sets.append(closed)
                self._next[key] = self._ids[closed]
        return self._next[key]

    def mask(self, state: int) -> torch.Tensor:
        """(V,) bool: the tokens allowed in ``state``."""
        if state not in self._masks:
            self._masks[state] = torch.tensor([self.step(state, t) >= 0 for t in range(self.vocab_size)])
        return self._masks[state]

    def accepting(self, state: int) -> bool:
        """Whether the output so far is a whole match."""
        return self._accept in self._sets[state]

    def matches(self, tokens: Sequence[int]) -> bool:
        state = 0
        for t in tokens:
            state = self.step(state, t)
            if state < 0:
                return False
        return self.accepting(state)


class Matcher:
    """One request's place in a grammar: the states after each accepted token, so it can roll back."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar, self.states = grammar, [0]

    @property
    def state(self) -> int:
        return self.states[-1]

    def allowed(self) -> torch.Tensor:
        """(V,) bool mask of the next token."""
        return self.grammar.mask(self.state)

    def finished(self) -> bool:
        """No token is allowed any more: the output is complete."""
        return not bool(self.allowed().any())

    def validate(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows in a row from here; does not advance."""
        state = self.state
        for i, t in enumerate(tokens):
            state = self.grammar.step(state, int(t))
            if state < 0:
                return i
        return len(tokens)

    def accept(self, tokens: Sequence[int]) -> bool:
        """Advance over ``tokens`` if the grammar allows all of them (True); otherwise change nothing."""
        if self.validate(tokens) < len(tokens):
            return False
        for t in tokens:
            self.states.append(self.grammar.step(self.state, int(t)))
        return True

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens."""
        if not 0 <= n < len(self.states):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self.states) - 1} were accepted")
        del self.states[len(self.states) - n:]


def masked_logits(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """(n, V) logits with every token a (n, V) bool mask forbids set to -inf: sampling from them at any
    temperature, top-k or top-p (or taking their argmax) is constrained sampling. The masks may stay on the host
    (a grammar's are made and kept there) while the logits are on a GPU."""
    if logits.shape != masks.shape or masks.dtype != torch.bool:
        raise ValueError(f"need logits and bool masks of one shape, got {tuple(logits.shape)} and "
                         f"{tuple(masks.shape)} {masks.dtype}")
    empty = (~masks.any(-1)).nonzero()
    if len(empty):
        raise ValueError(f"mask row {int(empty[0, 0])} allows no token: the grammar has ended there")
    return logits.masked_fill(~masks.to(logits.device), float("-inf"))


def speculative_masks(matcher: Matcher, drafts: Sequence[int]) -> tuple[int, torch.Tensor]:
    """(n, masks): n = how many drafts the grammar allows in a row; masks (n + 1, V) bool, row i the
    mask after drafts[:i] (row n: the mask at the first forbidden draft, or at the bonus position).
    The matcher ends where it started: the drafts are not committed."""
    ### BEGIN SOLUTION
    n = matcher.validate(drafts)
    rows = [matcher.allowed()]
    for t in drafts[:n]:
        matcher.accept([t])
        rows.append(matcher.allowed())
    matcher.rollback(n)
    return n, torch.stack(rows)
    ### END SOLUTION


def constrained_round(matcher: Matcher, drafts: Sequence[int], q: torch.Tensor, logits: torch.Tensor,
                      params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """One round of speculation under a grammar: the committed tokens, distributed as constrained
    target-only sampling's (the same tokens when greedy); the matcher ends after them.

    drafts: the gamma proposals; q: (gamma, V) what each was drawn from; logits: (gamma + 1, V) the
    target's at the last committed token and after each draft (unmasked). The drafts are cut after the
    first forbidden one, which stays as a certain rejection; if the grammar ends after draft n, the
    round commits at most n tokens (no bonus past the end)."""
    ### BEGIN SOLUTION
    n, masks = speculative_masks(matcher, drafts)
    ended = not bool(masks[n].any())
    kept = n if ended or n == len(drafts) else n + 1
    rows = torch.cat([masks, masks[-1:]])[: kept + 1]  # position n + 1 is never reached: draft n is rejected
    if ended:
        rows[n] = True  # a placeholder: a token drawn there lies past the end and is dropped
    committed = verify_drafts(list(drafts[:kept]), q[:kept], masked_logits(logits[: kept + 1], rows), params,
                              generator)
    committed = committed[:n] if ended else committed
    matcher.accept(committed)
    return committed
    ### END SOLUTION


@torch.inference_mode()
def constrained_target_only(target: Llama, prompt: list[int], n_tokens: int, grammar: Grammar,
                            params: SamplingParams = GREEDY, generator: torch.Generator | None = None) -> list[int]:
    """Constrained sampling, one target forward per token: at most n_tokens, fewer if the grammar ends."""
    check_request(target, None, prompt, n_tokens, 0)
    cache, tokens, matcher = KVCache(target.config), list(prompt), Matcher(grammar)
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), cache)
    while len(tokens) - len(prompt) < n_tokens and not matcher.finished():
        logits = target(torch.tensor([tokens[-1:]]), cache)[0, -1:]  # (1, V)
        token = int(sample(params.probs(masked_logits(logits, matcher.allowed()[None]))[0], generator))
        matcher.accept([token])
        tokens.append(token)
    return tokens[len(prompt):]


@torch.inference_mode()
def constrained_generate(target: Llama, draft: Llama, prompt: list[int], n_tokens: int, grammar: Grammar,
                         gamma: int, params: SamplingParams = GREEDY, generator: torch.Generator | None = None,
                         draft_follows_grammar: bool = True, stats: dict | None = None) -> list[int]:
    """Speculative decoding under a grammar, distributed as :func:`constrained_target_only`.

    ``draft_follows_grammar``: the draft samples from its own logits masked by a copy of the matcher (no
    draft is ever forbidden), or ignores the grammar (drafts are cut at the first forbidden one).
    ``stats``, if given, gets the rounds, drafts proposed and accepted, rounds ended by a rejection (a forbidden
    draft included), and drafts cut by the grammar."""
    check_request(target, draft, prompt, n_tokens, gamma)
    target_cache, draft_cache, tokens, matcher = KVCache(target.config), KVCache(draft.config), list(prompt), \
        Matcher(grammar)
    counts = {} if stats is None else stats
    counts.update({k: counts.get(k, 0) for k in ("rounds", "proposed", "accepted", "rejections", "cut")})
    if len(prompt) > 1:
        target(torch.tensor([prompt[:-1]]), target_cache)
        draft(torch.tensor([prompt[:-1]]), draft_cache)
    pending = tokens[-1:]
    while len(tokens) - len(prompt) < n_tokens and not matcher.finished():
        P = len(tokens)
        drafts, q_rows, feed, shadow = [], [], list(pending), Matcher(grammar)
        shadow.states = list(matcher.states)
        for _ in range(gamma):
            logits = draft(torch.tensor([feed]), draft_cache)[0, -1:]  # (1, V)
            if draft_follows_grammar:
                if shadow.finished():
                    logits = torch.zeros_like(logits)  # past the grammar's end: a placeholder draft, never used
                else:
                    logits = masked_logits(logits, shadow.allowed()[None])
            q = params.probs(logits)[0]
            drafts.append(int(sample(q, generator)))
            q_rows.append(q)
            shadow.accept(drafts[-1:])
            feed = drafts[-1:]
        logits = target(torch.tensor([tokens[-1:] + drafts]), target_cache)[0]  # (gamma + 1, V)
        allowed = matcher.validate(drafts)
        committed = constrained_round(matcher, drafts, torch.stack(q_rows), logits, params, generator)
        counts["rounds"] += 1
        counts["proposed"] += gamma
        accepted = next((i for i, (c, d) in enumerate(zip(committed, drafts)) if c != d), min(len(committed), gamma))
        counts["accepted"] += accepted
        counts["rejections"] += accepted < gamma and len(committed) > accepted  # a correction token ended it
        counts["cut"] += gamma - allowed
        tokens += committed
        pending = rollback(target_cache, draft_cache, P, drafts, committed)
    return tokens[len(prompt) : len(prompt) + n_tokens]
