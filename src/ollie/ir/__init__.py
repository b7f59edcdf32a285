"""The expression IR: index arithmetic, nodes, text syntax and structural checks."""

from ollie.ir.index import Affine, FloorDiv, Mod, Var, affine, as_affine, const, var
from ollie.ir.nodes import (
    Access,
    BinOp,
    Call,
    Const,
    Expr,
    Iter,
    Neg,
    Node,
    Scope,
    accesses,
    children,
    make_expr,
    map_body,
    neg,
    nested_scopes,
    rename_expr,
    tensor_names,
)
from ollie.ir.parser import parse
from ollie.ir.printer import format_expr, format_index, format_program, format_scope
from ollie.ir.program_text import is_program_text, parse_program
from ollie.ir.verify import verify, verify_scope

__all__ = [
    "Access", "Affine", "BinOp", "Call", "Const", "Expr", "FloorDiv", "Iter", "Mod", "Neg",
    "Node", "Scope", "Var", "accesses", "affine", "as_affine", "children", "const",
    "format_expr", "format_index", "format_program", "format_scope", "is_program_text",
    "make_expr", "map_body", "neg", "nested_scopes", "parse", "parse_program", "rename_expr",
    "tensor_names", "var", "verify", "verify_scope",
]
