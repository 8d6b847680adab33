"""What the fake model writes under a ``GuidedDecodingParams`` constraint.

Real TensorRT-LLM compiles the constraint with xgrammar and masks the logits at every step, so
the output satisfies it and ends with EOS once the grammar is complete. The fake model's choice
among the allowed continuations is deterministic: the first alternative, the fewest repetitions,
the first character of a class, only the required JSON properties. Every produced text is checked
against its constraint (``re.fullmatch`` for regexes and grammars), so a generator bug cannot
pass for enforcement. An invalid constraint raises ``ValueError``: the engine fails the request
in its stream, as it does when xgrammar cannot compile a grammar.
"""

from __future__ import annotations

import json
import re
from re import _constants as sre
from re import _parser as sre_parse
from typing import Any

_CATEGORY = {sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
             sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W"}
_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:;!?\"'{}[]()<>/\\"


def constrained_text(g) -> str | None:
    """The whole output under ``g``; ``None`` when the model writes freely (no constraint, or a
    structural tag whose triggers the free text never contains)."""
    if g is None:
        return None
    if g.json_object:
        return "{}"
    if g.json is not None:
        schema = g.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ValueError(f"invalid JSON schema: {exc}") from None
        return json.dumps(schema_instance(schema))
    if g.regex is not None:
        return regex_text(g.regex)
    if g.grammar is not None:
        return regex_text(grammar_regex(g.grammar))
    _check_structural_tag(g.structural_tag)
    return None


# --------------------------------------------------------------------------- regex


def regex_text(pattern: str) -> str:
    try:
        tree = sre_parse.parse(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    text = _walk(tree)
    assert re.fullmatch(pattern, text, re.DOTALL), f"fake guided generator: {text!r} does not match {pattern!r}"
    return text


def _walk(items) -> str:
    out = []
    for op, av in items:
        if op == sre.LITERAL:
            out.append(chr(av))
        elif op == sre.NOT_LITERAL:
            out.append(next(c for c in _ALPHABET if ord(c) != av))
        elif op == sre.ANY:
            out.append("a")
        elif op == sre.IN:
            out.append(_class_char(av))
        elif op == sre.BRANCH:
            out.append(_walk(av[1][0]))
        elif op in (sre.SUBPATTERN, sre.ATOMIC_GROUP):
            out.append(_walk(av[-1]))
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            out.append(_walk(av[2]) * av[0])
        elif op == sre.AT:
            continue
        else:  # backreferences and lookaround: outside the regular languages xgrammar accepts
            raise ValueError(f"regex construct {op} is not supported by xgrammar")
    return "".join(out)


def _class_char(items) -> str:
    if items and items[0][0] == sre.NEGATE:
        return next(c for c in _ALPHABET if not any(_in_class(c, it) for it in items[1:]))
    op, av = items[0]
    if op == sre.LITERAL:
        return chr(av)
    if op == sre.RANGE:
        return chr(av[0])
    return next(c for c in _ALPHABET if _in_class(c, items[0]))


def _in_class(c: str, item) -> bool:
    op, av = item
    if op == sre.LITERAL:
        return ord(c) == av
    if op == sre.RANGE:
        return av[0] <= ord(c) <= av[1]
    return re.fullmatch(_CATEGORY[av], c) is not None


# --------------------------------------------------------------------------- EBNF (xgrammar's GBNF dialect)

_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<str>"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\')|(?P<cls>\[(?:\\.|[^\]\\])*\])'
                    r'|(?P<name>[A-Za-z_][\w-]*)|(?P<op>::=|[()|*+?])|(?P<rep>\{\d+(?:,\d*)?\})')


def grammar_regex(grammar: str) -> str:
    """A non-recursive grammar as one regex, rule references inlined from ``root``."""
    tokens = []
    pos = 0
    while pos < len(grammar):
        m = _TOKEN.match(grammar, pos)
        if m is None:
            raise ValueError(f"EBNF grammar: unexpected {grammar[pos:pos + 10]!r} at offset {pos}")
        pos = m.end()
        if m.lastgroup:
            tokens.append((m.lastgroup, m.group(m.lastgroup)))
    rules: dict[str, list] = {}
    name = None
    for i, tok in enumerate(tokens):
        if tok[0] == "name" and i + 1 < len(tokens) and tokens[i + 1] == ("op", "::="):
            name = tok[1]
            rules[name] = []
        elif tok != ("op", "::="):
            if name is None:
                raise ValueError("EBNF grammar: expected a rule `name ::= ...`")
            rules[name].append(tok)
    if "root" not in rules:
        raise ValueError("EBNF grammar: no `root` rule")
    return _rule_regex(rules, "root", ())


def _rule_regex(rules: dict[str, list], name: str, stack: tuple[str, ...]) -> str:
    if name not in rules:
        raise ValueError(f"EBNF grammar: undefined rule {name!r}")
    if name in stack:
        raise NotImplementedError(f"fake guided decoding: recursive rule {name!r} is beyond this fake")
    parts = []
    for kind, value in rules[name]:
        if kind == "str":
            parts.append("(?:" + re.escape(value[1:-1].encode().decode("unicode_escape")) + ")")
        elif kind == "cls":
            parts.append(value)
        elif kind == "name":
            parts.append("(?:" + _rule_regex(rules, value, (*stack, name)) + ")")
        elif value == "(":
            parts.append("(?:")
        else:
            parts.append(value)
    return "".join(parts)


# --------------------------------------------------------------------------- JSON schema


def schema_instance(schema: Any) -> Any:
    """The fake model's value for ``schema``: the first allowed option, the smallest size."""
    if schema is True or schema == {}:
        return None
    if not isinstance(schema, dict):
        raise ValueError(f"invalid JSON schema {schema!r}: must be an object or true")
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return schema_instance(schema[key][0])
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {k: schema_instance(props.get(k, {})) for k in schema.get("required", [])}
    if kind == "array":
        return [schema_instance(schema.get("items", {}))] * schema.get("minItems", 0)
    if kind == "string":
        if "pattern" in schema:
            return regex_text(schema["pattern"])
        return "a" * schema.get("minLength", 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        return max(0, low) if "maximum" not in schema else min(max(0, low), schema["maximum"])
    if kind == "boolean":
        return True
    if kind in ("null", None):
        return None
    raise ValueError(f"invalid JSON schema: unknown type {kind!r}")


# --------------------------------------------------------------------------- structural tag


def _check_structural_tag(tag: str | None) -> None:
    """xgrammar's structural tag: free text, with ``schema`` enforced between ``begin`` and ``end``
    once a trigger appears; the fake's free text contains no trigger, so only the form is checked."""
    try:
        doc = json.loads(tag) if tag is not None else None
    except ValueError as exc:
        raise ValueError(f"invalid structural tag: {exc}") from None
    if not isinstance(doc, dict) or doc.get("type") != "structural_tag":
        raise ValueError('invalid structural tag: must be a JSON object with "type": "structural_tag"')
    if "format" in doc:
        return
    structures, triggers = doc.get("structures"), doc.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list) or not triggers:
        raise ValueError('invalid structural tag: needs "structures" and non-empty "triggers" lists')
    for s in structures:
        if not (isinstance(s, dict) and isinstance(s.get("begin"), str) and isinstance(s.get("end"), str)
                and "schema" in s):
            raise ValueError(f"invalid structural tag structure {s!r}: needs begin, schema and end")
        if not any(s["begin"].startswith(t) for t in triggers):
            raise ValueError(f"invalid structural tag: begin {s['begin']!r} starts with no trigger")
