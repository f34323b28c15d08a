"""Static checks of candidate source with tree-sitter (CUDA grammar, a superset of C++).

The findings are reasons a user reads. They are the first line of defence; every rule here also
has a runtime defence in the evaluator (poisoned outputs, rotated inputs, device-wide
synchronisation), so a candidate that hides a pattern from the parser (macros, say) is still
caught when it runs.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # "error" rejects the candidate; "warning" is reported
    message: str
    line: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.message} [{self.rule}]"


TORCH_INCLUDES = re.compile(r"^(torch/|ATen/|c10/|caffe2/|pybind11/|Python\.h|nanobind/)")
LIBRARY_INCLUDES = re.compile(r"^(cublas|cublasLt|cudnn|cufft|cusparse|cusolver|cutlass/|cute/|thrust/|curand)")
STREAM_CREATION = {"cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority",
                   "cuStreamCreate", "cuStreamCreateWithPriority", "cudaStreamBeginCapture", "cudaGraphLaunch"}
THREADS = {"pthread_create", "fork", "vfork", "clone", "std::thread", "std::jthread", "std::async", "thread",
           "jthread"}
LOADING = {"dlopen", "dlsym", "dlvsym", "dlmopen", "mprotect", "mmap", "ptrace", "process_vm_writev"}
PROCESS_IO = {"system", "popen", "execv", "execve", "execvp", "execl", "execlp", "getenv", "fopen", "open",
              "setenv", "putenv", "clock_settime", "settimeofday"}
LAUNCH_APIS = {"cudaLaunchKernel", "cudaLaunchKernelEx", "cuLaunchKernel", "cuLaunchKernelEx",
               "cudaLaunchCooperativeKernel"}
SYNC_APIS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaDeviceReset"}
LIBRARY_CALL = re.compile(r"^(cublas|cudnn|cufft|cusparse|cusolver|curand)[A-Z_]")
# Tokens that must not appear at all, even where the parser would not see a call (macros).
FORBIDDEN_TOKENS = STREAM_CREATION | {"pthread_create", "dlopen", "dlsym", "mprotect", "popen", "system",
                                      "clock_settime", "settimeofday"}


@lru_cache(maxsize=1)
def _parser():
    import tree_sitter as ts
    import tree_sitter_cuda as tsc

    return ts.Parser(ts.Language(tsc.language()))


def _text(src: bytes, node) -> str:
    return src[node.start_byte:node.end_byte].decode(errors="replace")


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _declarator_name(node, src: bytes) -> str | None:
    for n in _walk(node):
        if n.type in ("identifier", "field_identifier"):
            return _text(src, n)
    return None


def _is_function_declaration(decl) -> bool:
    return any(c.type == "function_declarator" for c in _walk(decl))


def _qualifiers(decl, src: bytes) -> set[str]:
    q = set()
    for c in decl.children:
        if c.type in ("type_qualifier", "storage_class_specifier", "__device__", "__managed__", "__constant__",
                      "__shared__"):
            q.add(_text(src, c).strip())
    text = _text(src, decl)
    for kw in ("__device__", "__managed__", "__constant__", "constexpr", "extern", "typedef"):
        if re.search(rf"\b{kw}\b", text.split("=")[0]):
            q.add(kw)
    return q


def _readonly(decl, src: bytes, quals: set[str]) -> bool:
    """True when the declared variable itself cannot change (``const int``, ``float* const``,
    ``constexpr``); ``const float*`` is a mutable pointer to const data."""
    if "constexpr" in quals:
        return True
    for c in decl.children:
        node = c.child_by_field_name("declarator") if c.type == "init_declarator" else c
        if node is None:
            continue
        if node.type == "pointer_declarator":
            return any(q.type == "type_qualifier" and _text(src, q) == "const" for q in node.children)
        if node.type in ("identifier", "array_declarator"):
            return "const" in quals
    return "const" in quals


def check_source(source: str, backend: str, *, allow_libraries: bool = False) -> list[Finding]:
    # The ABI's export macro hides a function's return type from the parser; show it what it means.
    text = re.sub(r"\bFORGE_EXPORT\b", 'extern "C"', source)
    # Launch attributes the grammar does not know (thread-block clusters, register caps) would hide
    # the kernel's name from it; blank them out, keeping every offset and line.
    src = re.sub(r"\b(__cluster_dims__|__maxnreg__)\s*\([^()]*\)", lambda m: " " * len(m.group(0)), text).encode()
    tree = _parser().parse(src)
    findings: list[Finding] = []
    kernels: dict[str, int] = {}
    launched: set[str] = set()
    launch_apis = 0
    entries: set[str] = set()

    def add(rule, sev, msg, node=None):
        findings.append(Finding(rule, sev, msg, node.start_point[0] + 1 if node is not None else None))

    for n in _walk(tree.root_node):
        t = n.type
        if t == "preproc_include":
            path = _text(src, n.child_by_field_name("path") or n).strip().strip('<>"')
            if TORCH_INCLUDES.match(path):
                add("no-pytorch", "error", f"includes {path}: candidates may not use PyTorch or Python", n)
            elif LIBRARY_INCLUDES.match(path):
                if allow_libraries:
                    add("library", "warning", f"includes {path}: a vendor library call (allowed for this card)", n)
                else:
                    add("library", "error", f"includes {path}: vendor library calls are not kernels and this card "
                        "does not allow them", n)
        elif t == "function_definition":
            decl = n.child_by_field_name("declarator")
            name = _declarator_name(decl, src) if decl is not None else None
            if any(c.type == "__global__" for c in n.children):
                if name:
                    kernels[name] = n.start_point[0] + 1
            if name in ("forge_launch", "forge_launch_ws", "forge_workspace_bytes"):
                entries.add(name)
        elif t == "call_expression":
            fn = n.child_by_field_name("function")
            name = _text(src, fn) if fn is not None else ""
            base = name.split("<")[0].strip()
            ksyntax = next((c for c in n.children if c.type == "kernel_call_syntax"), None)
            if ksyntax is not None:
                launched.add(base)
                args = [c for c in ksyntax.children if c.type not in ("<<<", ">>>", ",")]
                if len(args) < 4:
                    add("stream", "warning", f"{base} is launched without the stream argument (it runs on the "
                        "legacy default stream, not the one forge_launch was given)", n)
            short = base.split("::")[-1]
            if short in LAUNCH_APIS:
                launch_apis += 1
            if base in STREAM_CREATION or short in STREAM_CREATION:
                add("no-streams", "error", f"calls {base}: candidates must launch on the stream they are given, "
                    "never on streams or graphs of their own", n)
            elif base in THREADS or base in ("std::async",):
                add("no-threads", "error", f"calls {base}: candidates may not start threads or processes", n)
            elif short in LOADING:
                add("no-loading", "error", f"calls {short}: candidates may not load code or change memory protection", n)
            elif short in PROCESS_IO:
                add("no-io", "error", f"calls {short}: candidates may not run processes, read files or the "
                    "environment, or change clocks", n)
            elif LIBRARY_CALL.match(short):
                add("library", "warning" if allow_libraries else "error",
                    f"calls {short}: a vendor library call" + ("" if allow_libraries else
                                                               " (this card does not allow them)"), n)
            elif short in SYNC_APIS:
                add("sync", "warning", f"calls {short}: synchronising inside forge_launch serialises the pipeline", n)
        elif t in ("qualified_identifier", "type_identifier") and _text(src, n) in ("std::thread", "std::jthread"):
            add("no-threads", "error", f"uses {_text(src, n)}: candidates may not start threads", n)
        elif t == "declaration":
            parent = n.parent
            at_file_scope = parent is not None and parent.type in ("translation_unit", "declaration_list")
            if _is_function_declaration(n) and not any(c.type == "init_declarator" for c in n.children):
                continue
            quals = _qualifiers(n, src)
            name = _declarator_name(n, src) or "?"
            readonly = _readonly(n, src, quals)
            if at_file_scope:
                if "extern" in quals or "typedef" in quals:
                    continue
                if not any(c.type in ("identifier", "init_declarator", "array_declarator", "pointer_declarator")
                           for c in n.children):
                    continue  # a struct or enum definition, no variable
                if "__constant__" in quals:
                    if not any(c.type == "init_declarator" for c in n.children):
                        add("no-state", "error", f"__constant__ {name} is written at run time: state that "
                            "persists across calls", n)
                elif not readonly:
                    kind = "__device__ " if "__device__" in quals or "__managed__" in quals else ""
                    add("no-state", "error", f"{kind}global variable {name} is mutable: state that persists "
                        "across calls", n)
            elif "static" in quals and not readonly:
                add("no-state", "error", f"static variable {name} keeps state across calls", n)
        elif t == "attribute_specifier" or (t == "ERROR" and "constructor" in _text(src, n)):
            if "constructor" in _text(src, n) or "destructor" in _text(src, n):
                add("no-loading", "error", "code that runs when the library is loaded (constructor attribute)", n)

    clean = _strip_comments(source)
    for tok in sorted(FORBIDDEN_TOKENS):
        m = re.search(rf"\b{re.escape(tok)}\b", clean)
        if m and not any(tok in f.message for f in findings):
            line = clean.count("\n", 0, m.start()) + 1
            findings.append(Finding("forbidden-name", "error", f"mentions {tok}, which candidates may not use", line))
    if "__attribute__((constructor" in clean.replace(" ", "") and not any(f.rule == "no-loading" for f in findings):
        findings.append(Finding("no-loading", "error", "code that runs when the library is loaded (constructor)"))
    if re.search(r"/proc/self", clean):
        findings.append(Finding("no-io", "error", "reads /proc/self: candidates may not inspect the process"))

    if "forge_launch" in entries and "forge_launch_ws" in entries:
        findings.append(Finding("entry", "error", "both forge_launch and forge_launch_ws are defined: define "
                                "exactly one (see forge_kernel.h)"))
    elif "forge_launch_ws" in entries and "forge_workspace_bytes" not in entries:
        findings.append(Finding("entry", "error", "forge_launch_ws is defined without forge_workspace_bytes "
                                "(see forge_kernel.h)"))
    elif not entries & {"forge_launch", "forge_launch_ws"}:
        findings.append(Finding("entry", "error", "forge_launch is not defined (see forge_kernel.h)"))
    if backend == "cuda":
        if not kernels:
            findings.append(Finding("kernel", "error", "no __global__ kernel is defined: a candidate must run its "
                                    "own kernel"))
        elif not (launched & set(kernels)) and not launch_apis:
            names = ", ".join(sorted(kernels))
            findings.append(Finding("kernel", "error", f"kernel {names} is defined but never launched"))
    findings.extend(_include_findings(source))
    if tree.root_node.has_error and not any(f.severity == "error" for f in findings):
        findings.append(Finding("parse", "warning", "the parser could not read all of the source (macros?); the "
                                "compiler decides"))
    return findings


def _include_findings(source: str) -> list[Finding]:
    """Includes that would make the compiler read a file outside the toolchain and the ABI header
    (absolute, ``..``, ``.incbin``, ``#embed``): the builder refuses them too (``includes.py``)."""
    from ..kernel_abi import HEADER
    from .includes import source_problems

    return [Finding("include", "error", why, line) for line, why in source_problems(source, HEADER.name)]


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]
