"""The source pane: a node's kernel with CUDA/C++ highlighting (tree-sitter-cuda, the grammar the
static checks parse with), read-only; the errors pane moves its cursor to a diagnostic's line."""

from __future__ import annotations

from textual.widgets import TextArea
from textual.widgets.text_area import Selection

# captures Textual's highlight themes know (keyword, type, string, comment, number, function, ...)
CUDA_HIGHLIGHTS = r"""
(comment) @comment
[(string_literal) (raw_string_literal) (char_literal) (system_lib_string)] @string
(number_literal) @number
[(true) (false) (null)] @boolean
[(primitive_type) (sized_type_specifier) (type_identifier)] @type
(preproc_directive) @keyword
["#include" "#define" "#if" "#ifdef" "#ifndef" "#else" "#elif" "#endif"] @keyword
["if" "else" "for" "while" "do" "return" "break" "continue" "switch" "case" "default" "goto"] @keyword
["const" "static" "extern" "inline" "volatile" "struct" "union" "enum" "typedef" "sizeof"
 "template" "typename" "namespace" "using" "class" "constexpr" "unsigned" "signed" "restrict"] @keyword
["__global__" "__device__" "__host__" "__forceinline__" "__launch_bounds__"] @keyword
(function_declarator declarator: (identifier) @function)
(call_expression function: (identifier) @function)
(field_expression field: (field_identifier) @property)
["<<<" ">>>"] @operator
"""


def _register(area: TextArea) -> bool:
    try:
        import tree_sitter_cuda
        from tree_sitter import Language
    except ImportError:  # pragma: no cover - tree-sitter-cuda is a dependency
        return False
    try:
        area.register_language("cuda", Language(tree_sitter_cuda.language()), CUDA_HIGHLIGHTS)
    except Exception:  # noqa: BLE001 - a grammar that does not fit the query: plain text, never a crash
        return False
    return True


class SourceView(TextArea):
    """Read-only source with line numbers; ``goto(line)`` selects a 1-based line."""

    DEFAULT_CSS = """
    SourceView { height: 1fr; border: none; padding: 0; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", read_only=True, show_line_numbers=False, soft_wrap=False, **kwargs)  # type: ignore[arg-type]
        self._cuda = _register(self)

    def show(self, source: str, language: str = "cuda") -> None:
        lang = "python" if language == "python" else ("cuda" if self._cuda else None)
        try:
            self.language = lang
        except Exception:  # noqa: BLE001 - no highlighting for this language here
            self.language = None
        self.show_line_numbers = bool(source.strip())  # an empty pane shows no stray "1"
        self.load_text(source)
        self.move_cursor((0, 0))

    def goto(self, line: int) -> None:
        """Select a 1-based line, the cursor at its start: the view scrolls to show the line from
        its first column, not to the end of a long line."""
        row = max(0, min(line - 1, self.document.line_count - 1))
        end = len(self.document.get_line(row))
        self.selection = Selection((row, end), (row, 0))
        self.scroll_cursor_visible(center=True)
        self.scroll_to(x=0, animate=False)
