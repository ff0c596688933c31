"""What a submission controls, made inert before an instructor reads it (cohort grading, issue 51).

* :func:`visible`: a name, a message or a quoted line with every control character shown as an escape (``\\x1b``,
  ``\\n``, ``\\u2028``; a byte that was not UTF-8 in a folder name as ``\\xe9``), so a terminal, a report or a
  spreadsheet shows what is there: no ANSI sequence hides a flag, no newline starts a fake line, no bidi override
  reorders one. Capped in length.
* :func:`csv_cell`: the same, and a leading ``= + - @`` (a spreadsheet formula) neutralised with a quote.
* :func:`sanitise_html`: nbgrader's feedback page cut down to an allow-list of inert tags and attributes (Python's
  ``html.parser``; everything written back escaped, so a browser parses the result as this parser did). The
  template's ``<style>`` in the page's head stays as it is; every ``<script>`` goes (MathJax's too: formulas then
  show as TeX), as do ``on*`` handlers, URLs other than http(s), relative and, for an image, ``data:image/``
  (png, jpeg, gif, webp, svg+xml: an ``<img>`` runs no script of an SVG), frames, objects, inline SVG, MathML,
  forms, ``<base>``, ``<meta http-equiv>``, ``<title>`` and styles outside the head, and style attributes beyond a
  few colour and text properties.
"""

from __future__ import annotations

import re
from html import escape
from html.parser import HTMLParser

#: C0 and C1 controls, DEL, the bidi marks and overrides (U+061C, U+200E-F, U+202A-E, U+2066-9), the line and
#: paragraph separators (U+2028-9), and lone surrogates (bytes that were not UTF-8 in a name os.listdir gave).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if char in _SHORT:
        return _SHORT[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte itself
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def cap(text: str, limit: int) -> str:
    """text, cut to ``limit`` characters with a note of how many were left out (what is stored; :func:`visible`
    escapes it when it is shown)."""
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit:,} more characters]"


def visible(text, limit: int | None = None) -> str:
    """``text`` (any object: its str) with every control character escaped; at most ``limit`` characters of it."""
    text = text if isinstance(text, str) else str(text)
    if limit is None:
        return _UNSAFE.sub(_escape, text)
    shown = _UNSAFE.sub(_escape, text[:limit])
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return f"{shown[:limit]}… [{max(len(text), len(shown)) - limit:,} more characters]"


def csv_cell(text, limit: int = 2000) -> str:
    """A CSV field: :func:`visible`, and a spreadsheet formula (a leading ``= + - @``) turned into text."""
    shown = visible(text, limit)
    return "'" + shown if shown[:1] in ("=", "+", "-", "@") else shown


# -- feedback HTML ----------------------------------------------------------------------------------------------------

#: Tags kept (their attributes filtered); any other tag is dropped and its content kept, as escaped text and
#: allowed tags. ``title``, ``style`` and ``meta`` only in the page's head.
_TAGS = {
    "html", "head", "body", "title", "meta", "style", "main", "section", "article", "header", "footer", "nav", "aside",
    "div", "span", "p", "br", "hr", "pre", "code", "kbd", "samp", "var", "tt", "a", "strong", "b", "em", "i", "u", "s",
    "strike", "del", "ins", "sub", "sup", "small", "big", "mark", "abbr", "cite", "q", "dfn", "blockquote", "center",
    "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tfoot", "tr",
    "th", "td", "caption", "colgroup", "col", "img", "figure", "figcaption", "details", "summary",
}
_HEAD_ONLY = {"title", "style", "meta"}
_VOID = {"br", "hr", "img", "meta", "col", "wbr", "area", "base", "input", "link", "source", "track", "embed", "param"}
#: Raw-text elements whose content is code, not text: dropped with it (the head's <style> excepted).
_DROP_CONTENT = {"script", "style"}
#: Active elements whose removal the reader should see.
_NOTED = {"svg", "math", "iframe", "frame", "frameset", "object", "embed", "applet", "form"}
_ATTRIBUTES = {"class", "id", "title", "alt", "lang", "name", "role", "tabindex", "style"}
_TAG_ATTRIBUTES = {
    "a": {"href"}, "img": {"src", "width", "height"}, "td": {"colspan", "rowspan", "align", "valign"},
    "th": {"colspan", "rowspan", "align", "valign", "scope"}, "ol": {"start", "type"}, "col": {"span"},
    "colgroup": {"span"}, "details": {"open"}, "meta": {"charset"}, "style": {"type"}, "table": {"border"},
}
_DATA_ATTRIBUTE = re.compile(r"(data|aria)-[a-z0-9_.-]+")
_URL_SPACE = re.compile("[\t\n\r]")
_SCHEME = re.compile(r"([^/?#]*?):")
#: Images an <img> may show from a data: URL (an SVG shown by <img> runs no script and loads nothing: nbconvert shows
#: image/svg+xml outputs that way).
_IMAGE_DATA = re.compile(r"data:image/(png|jpeg|jpg|gif|webp|svg\+xml)[;,]", re.IGNORECASE)
_STYLE_PROPERTIES = {"color", "background-color", "font-weight", "font-style", "text-decoration", "text-align",
                     "vertical-align", "white-space"}
_STYLE_VALUE = re.compile(r"[#a-zA-Z0-9.,%()\s-]*")
_COLOUR_FUNCTION = re.compile(r"\b(rgba?|hsla?)\(", re.IGNORECASE)


def safe_url(value: str, image: bool = False) -> str | None:
    """The URL if following it runs nothing (http, https, relative, #anchor; for an image, data:image/png and the
    like), else None."""
    url = _URL_SPACE.sub("", value).strip("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x11\x12\x13"
                                          "\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f ")
    scheme = _SCHEME.match(url)
    if scheme is None:
        return url
    if scheme.group(1).lower() in ("http", "https") or (image and _IMAGE_DATA.match(url)):
        return url
    return None


def safe_style(value: str) -> str:
    """The declarations of a style attribute that only colour or set text (no url(), no expression(), no
    position): the rest dropped."""
    kept = []
    for declaration in value.split(";"):
        name, colon, setting = declaration.partition(":")
        name, setting = name.strip().lower(), setting.strip()
        if (colon and name in _STYLE_PROPERTIES and _STYLE_VALUE.fullmatch(setting)
                and "(" not in _COLOUR_FUNCTION.sub("", setting)):
            kept.append(f"{name}: {setting}")
    return "; ".join(kept)


class _Sanitiser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.head = "before"  # "in" from the first <head> to </head> or <body>, then "after"
        self.dropping: str | None = None  # the raw-text element whose content is being dropped
        self.styling = False  # inside the head's <style>: its text is CSS, kept as it is

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._start(tag, attrs, closed=False)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self._start(tag, attrs, closed=True)

    def _start(self, tag: str, attrs: list, closed: bool) -> None:
        if self.dropping:
            return
        if tag == "head" and self.head == "before":
            self.head = "in"
        elif tag == "body":
            self.head = "after"
        if tag in _DROP_CONTENT and not (tag == "style" and self.head == "in"):
            if not closed:  # <script/>: the parser opens no raw text for it, so nothing follows to drop
                self.dropping = tag
            return
        if tag in _NOTED:
            self.out.append(escape(f"[{tag} removed by the grader]"))
        if tag not in _TAGS or (tag in _HEAD_ONLY and self.head != "in"):
            return
        kept = self._attributes(tag, attrs)
        if tag == "meta" and not kept:
            return
        self.out.append(f"<{tag}{''.join(kept)}>")
        if tag == "style" and not closed:
            self.styling = True

    @staticmethod
    def _attributes(tag: str, attrs: list) -> list[str]:
        kept = []
        for name, value in attrs:
            name, value = name.lower(), "" if value is None else value
            if not (name in _ATTRIBUTES or name in _TAG_ATTRIBUTES.get(tag, ()) or _DATA_ATTRIBUTE.fullmatch(name)):
                continue
            if name in ("href", "src"):
                value = safe_url(value, image=tag == "img")
            elif name == "style":
                value = safe_style(value) or None
            if value is not None:
                kept.append(f' {name}="{escape(value, quote=True)}"')
        return kept

    def handle_endtag(self, tag: str) -> None:
        if self.dropping:
            if tag == self.dropping:
                self.dropping = None
            return
        if tag == "style" and self.styling:
            self.styling = False
            self.out.append("</style>")
            return
        if tag == "head" and self.head == "in":
            self.head = "after"
        if tag in _TAGS and tag not in _VOID and tag not in _HEAD_ONLY | {"style"}:
            self.out.append(f"</{tag}>")
        elif tag == "title" and self.head == "in":
            self.out.append("</title>")

    def handle_data(self, data: str) -> None:
        if self.dropping:
            return
        self.out.append(data.replace("</", "<\\/") if self.styling else escape(data, quote=False))

    def handle_decl(self, decl: str) -> None:
        if decl.strip().lower() == "doctype html":
            self.out.append("<!DOCTYPE html>")

    # comments, processing instructions and CDATA sections: dropped
    def handle_comment(self, data: str) -> None:
        pass

    def handle_pi(self, data: str) -> None:
        pass

    def unknown_decl(self, data: str) -> None:
        pass

    def result(self) -> str:
        if self.dropping:
            self.out.append(escape(f"[the rest of this page was inside an unclosed <{self.dropping}> of the submission, "
                                   "and was removed by the grader]"))
        if self.styling:
            self.out.append("</style>")
        return "".join(self.out)


def sanitise_html(text: str) -> str:
    """An HTML page with nothing active left in it (see the module's docstring): what an instructor can open."""
    parser = _Sanitiser()
    parser.feed(text)
    parser.close()
    return parser.result()
