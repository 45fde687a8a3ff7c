"""Just enough HCL for static checks of infra/terraform, with the standard library only.

`mask` blanks out comments, string contents (interpolations included) and heredoc bodies,
keeping every offset and newline, so that braces and brackets in the masked text are
structure only. `blocks` finds blocks by matching braces in the masked text and reads their
headers and attributes from the original.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEREDOC = re.compile(r"<<-?([A-Za-z_]\w*)\n")
_HEADER = re.compile(r'([A-Za-z_][\w-]*)((?:\s+"[^"\n]*")*)')
_ATTRIBUTE = re.compile(r"^[ \t]*([A-Za-z_][\w-]*)[ \t]*=(?!=)", re.MULTILINE)
_OPEN, _CLOSE = "([{", ")]}"


class HclError(ValueError):
    """The text is not HCL that these helpers can follow (unbalanced, unterminated)."""


def mask(text: str, *, strings: bool = True) -> str:
    """`text` with comments (and, if `strings`, string and heredoc contents) as spaces."""
    out = list(text)
    i, n = 0, len(text)

    def blank(start: int, end: int) -> None:
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "#" or text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise HclError("unterminated /* comment")
            blank(i, end + 2)
            i = end + 2
        elif c == '"':
            end = _string_end(text, i)
            if strings:
                blank(i, end)
            i = end
        elif (heredoc := _HEREDOC.match(text, i)) is not None:
            terminator = re.compile(rf"^[ \t]*{heredoc.group(1)}[ \t]*$", re.MULTILINE)
            found = terminator.search(text, heredoc.end())
            if found is None:
                raise HclError(f"unterminated heredoc {heredoc.group(1)}")
            if strings:
                blank(i, found.end())
            i = found.end()
        else:
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """Offset just past the string that opens at `start`, interpolations included."""
    i, depth = start + 1, 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if depth == 0 and c == '"':
            return i + 1
        if text.startswith("${", i) or text.startswith("%{", i):
            depth += 1
            i += 2
            continue
        if depth and c == "}":
            depth -= 1
        elif depth and c == '"':
            i = _string_end(text, i)
            continue
        elif c == "\n" and depth == 0:
            raise HclError("newline in a quoted string")
        i += 1
    raise HclError("unterminated string")


@dataclass(frozen=True)
class Block:
    type: str
    labels: tuple[str, ...]
    body: str  # the original text between the braces

    def blocks(self, type_: str | None = None) -> list[Block]:
        return blocks(self.body, type_)

    def block(self, type_: str) -> Block:
        (found,) = self.blocks(type_)
        return found

    def attributes(self) -> dict[str, str]:
        """Top-level `name = expression` pairs of the body, expressions as source text."""
        return attributes(self.body)

    def get(self, name: str) -> str | None:
        return self.attributes().get(name)


def blocks(text: str, type_: str | None = None) -> list[Block]:
    """The top-level blocks of `text` (of one type, if given)."""
    masked = mask(text)
    found: list[Block] = []
    depth, header_start = 0, 0
    opened: tuple[int, re.Match[str]] | None = None
    for i, c in enumerate(masked):
        if c in _OPEN:
            if depth == 0:
                header = _HEADER.fullmatch(text[header_start:i].strip())
                opened = (i, header) if c == "{" and header else None
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                raise HclError(f"unbalanced {c!r} at offset {i}")
            if depth == 0:
                if opened is not None:
                    start, header = opened
                    labels = tuple(re.findall(r'"([^"]*)"', header.group(2)))
                    found.append(Block(header.group(1), labels, text[start + 1 : i]))
                opened, header_start = None, i + 1
        elif c == "\n" and depth == 0:
            header_start = i + 1
    if depth != 0:
        raise HclError("unbalanced brackets at the end of the text")
    return [b for b in found if type_ is None or b.type == type_]


def attributes(text: str) -> dict[str, str]:
    masked = mask(text)
    depths = _depths(masked)
    found: dict[str, str] = {}
    for match in _ATTRIBUTE.finditer(masked):
        if depths[match.start(1)] != 0:
            continue
        end = match.end()
        while end < len(masked) and not (masked[end] == "\n" and depths[end] == 0):
            end += 1
        found[match.group(1)] = text[match.end() : end].strip()
    return found


def _depths(masked: str) -> list[int]:
    """Bracket depth at each offset (the closing bracket counts as inside)."""
    depths, depth = [], 0
    for c in masked:
        if c in _OPEN:
            depth += 1
            depths.append(depth)
        elif c in _CLOSE:
            depths.append(depth)
            depth -= 1
        else:
            depths.append(depth)
    return depths


def string_list(expression: str) -> list[str]:
    """The quoted strings of a list expression such as `["a", "b"]`."""
    return re.findall(r'"((?:[^"\\]|\\.)*)"', expression)
