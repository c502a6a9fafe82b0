#!/usr/bin/env python3
"""Builds lua/tb.lua, the script every package runs, from lua/tb.source.lua, the one to read and edit.

The source names its constants once, at the top level: `local NAME = <value>`, NAME in capitals, the value
literals (numbers, strings) and operators, or names defined above it. lua/tb.lua is the source with each use of
such a name (outside comments and strings) replaced by its value, written `<value> --[[NAME]]`; a value that is
more than one token is put in parentheses (Lua folds the arithmetic of numeric literals when it compiles). Nothing
else changes: the definitions stay, and lines keep their numbers after the generated header.

Why: the EVAL form runs the whole file on every call, and every top-level local that a function captures costs that
call an upvalue to create, find and close, which make bench-lua shows on an allowed EVALSHA. A literal costs
nothing.

  scripts/lua_inline.py           writes lua/tb.lua
  scripts/lua_inline.py --check   exits 1 when lua/tb.lua is not what the source generates (make lint)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "lua" / "tb.source.lua"
TARGET = ROOT / "lua" / "tb.lua"

HEADER = (
    "-- Generated from lua/tb.source.lua by scripts/lua_inline.py (make lua): edit that file, not this one. Its named\n"
    "-- constants are written here as literals, each followed by its name, so that no function captures them.\n"
)

# One token of Lua: a long comment or string, a line comment, a quoted string, a name, or any other character.
TOKEN = re.compile(
    r"""(?P<long>--\[(?P<eq>=*)\[.*?\](?P=eq)\]|\[(?P<eq2>=*)\[.*?\](?P=eq2)\])"""
    r"""|(?P<comment>--[^\n]*)"""
    r"""|(?P<string>'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")"""
    r"""|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"""
    r"""|(?P<other>.)""",
    re.DOTALL,
)
DEFINITION = re.compile(r"local ([A-Z][A-Z0-9_]*) =[ \n]\s*")
NUMBER = re.compile(r"\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")
OPERATOR = re.compile(r"[-+*/ ]+")


def constant_value(text, constants):
    """The value of a definition's right-hand side with names replaced, or None if it is not a constant."""
    rest, parts, tokens = text, [], 0
    while rest and not rest.startswith("--"):
        for pattern in (NUMBER, OPERATOR):
            match = pattern.match(rest)
            if match:
                break
        else:
            match = re.match(r"'[^'\\\n]*'|\"[^\"\\\n]*\"|[A-Z][A-Z0-9_]*", rest)
            if not match:
                return None
        token = match.group(0)
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", token):
            if token not in constants:
                return None
            token = constants[token]
        parts.append(token)
        tokens += 0 if OPERATOR.fullmatch(match.group(0)) else 1
        rest = rest[match.end() :]
    value = "".join(parts).strip()
    # One token stands alone; anything more (a sign included) goes in parentheses.
    return value if tokens == 1 and not value.startswith("-") else f"({value})"


def generate(source):
    constants, out, at_line_start = {}, [], True
    position = 0
    while position < len(source):
        if at_line_start:
            definition = DEFINITION.match(source, position)
            if definition:
                end = source.index("\n", definition.end())
                value = constant_value(source[definition.end() : end].strip(), constants)
                if value is not None:
                    # The definition stays as written; later uses get its value.
                    out.append(source[position:end])
                    constants[definition.group(1)] = value
                    position = end
                    continue
        token = TOKEN.match(source, position)
        text = token.group(0)
        if token.group("name") and text in constants and source[position - 1] != ".":
            out.append(f"{constants[text]} --[[{text}]]")
        else:
            out.append(text)
        at_line_start = text.endswith("\n")
        position = token.end()
    return HEADER + "".join(out)


def main():
    generated = generate(SOURCE.read_text())
    if sys.argv[1:] == ["--check"]:
        if TARGET.read_text() != generated:
            sys.exit("lua/tb.lua is not what lua/tb.source.lua generates: run make lua")
        return
    TARGET.write_text(generated)


if __name__ == "__main__":
    main()
