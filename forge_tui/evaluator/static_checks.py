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
    """``node`` and every node below it, in source order (parents before their children).

    A tree cursor moves through the tree without building each node's list of children, several
    times faster than a stack of ``children`` lists on a candidate's few thousand nodes."""
    cursor = node.walk()
    while True:
        yield cursor.node
        if cursor.goto_first_child():
            continue
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return


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

    seen = {(f.rule, f.line) for f in findings}
    findings.extend(f for f in state_findings(tree.root_node, src) if (f.rule, f.line) not in seen)
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


# ---- state that persists across calls, in the forms the walk above does not see ----------------
FILE_IO = {"creat", "open64", "openat", "fopen64", "freopen", "fdopen", "tmpfile", "tmpfile64", "mkstemp",
           "mkstemps", "mkostemp", "mkdtemp", "tmpnam", "tempnam", "shm_open", "memfd_create", "mkfifo",
           "syscall"}
ENVIRONMENT = {"secure_getenv", "unsetenv", "clearenv"}
ENVIRONMENT_NAMES = {"environ", "__environ", "_environ"}
FILE_STREAMS = {"ofstream", "ifstream", "fstream", "filebuf", "basic_ofstream", "basic_fstream", "basic_filebuf"}
DESCRIPTOR_FIELDS = {"forge_tensor": {"data", "dtype", "ndim", "shape", "stride"},
                     "forge_scalar": {"kind", "reserved", "i", "f"}}
_SCOPES = ("translation_unit", "declaration_list", "template_declaration", "linkage_specification")


def _storage_classes(node, src: bytes) -> set[str]:
    return {_text(src, c).strip() for c in node.children if c.type == "storage_class_specifier"}


def _type_is_const(node, src: bytes) -> bool:
    """Whether the declared type itself is const (``const float x``, ``float const x``), not a
    pointer's own qualifier."""
    return any(c.type == "type_qualifier" and _text(src, c) in ("const", "constexpr") for c in node.children)


def _writable_storage(node, src: bytes) -> str | None:
    """How a variable (or static data member) declaration keeps writable storage, or None where it
    cannot change: the variable itself writable, or a const pointer or a reference that reaches
    writable storage (``static float* const memo = new float[n]``)."""
    if any(c.type == "type_qualifier" and _text(src, c) == "constexpr" for c in node.children):
        return None
    const_type = _type_is_const(node, src)
    for c in node.children:
        decl, init = c, None
        if c.type == "init_declarator":
            decl, init = c.child_by_field_name("declarator"), c.child_by_field_name("value")
        if decl is None:
            continue
        while decl is not None and decl.type == "qualified_identifier":  # Memo::buf, Tm<T>::slot
            decl = decl.child_by_field_name("name")
        if decl is None:
            continue
        if decl.type == "pointer_declarator":
            pointer_const = any(q.type == "type_qualifier" and _text(src, q) == "const" for q in decl.children)
            if not pointer_const:
                return "a writable pointer"
            null = init is None or _text(src, init).strip() in ("nullptr", "NULL", "0", "{}")
            if not const_type and not null:
                return "a fixed pointer to writable storage"
            continue
        if decl.type == "reference_declarator":
            if not const_type:
                return "a reference to writable storage"
            continue
        if decl.type in ("identifier", "field_identifier", "array_declarator") and not const_type:
            return "writable"
    return None


def _scope_kind(node) -> str:
    """'file' for a declaration at namespace scope (inside templates, namespaces and extern "C"
    blocks too), 'class' for a member, 'block' inside a function."""
    p = node.parent
    while p is not None and p.type in ("template_declaration", "linkage_specification", "declaration_list"):
        p = p.parent
    if p is None or p.type == "translation_unit":
        return "file"
    if p.type == "field_declaration_list":
        return "class"
    return "block"


def _descriptor_params(fn, src: bytes) -> dict[str, str]:
    """A function definition's parameters that point at ABI descriptors: name -> forge_tensor or
    forge_scalar."""
    out: dict[str, str] = {}
    decl = fn.child_by_field_name("declarator")
    params = next((n for n in _walk(decl) if n.type == "parameter_list"), None) if decl is not None else None
    for p in params.children if params is not None else []:
        if p.type != "parameter_declaration":
            continue
        kind = next((k for k in DESCRIPTOR_FIELDS if re.search(rf"\b{k}\b", _text(src, p))), None)
        name = _declarator_name(p.child_by_field_name("declarator"), src) if p.child_by_field_name("declarator") else None
        if kind and name and "*" in _text(src, p):
            out[name] = kind
    return out


def _descriptor_aliases(body, src: bytes, params: dict[str, str]) -> None:
    """Adds to ``params`` the local pointers and references to descriptors that a function sets
    from them (``forge_tensor* o = &out[0]``), and theirs in turn."""
    decls = [d for d in _walk(body) if d.type == "declaration"]
    for _ in range(3):
        grew = False
        for d in decls:
            head = _text(src, d).split("=")[0]
            kind = next((k for k in DESCRIPTOR_FIELDS if re.search(rf"\b{k}\b", head)), None)
            if kind is None or ("*" not in head and "&" not in head):
                continue
            for c in d.children:
                if c.type != "init_declarator":
                    continue
                name = _declarator_name(c.child_by_field_name("declarator"), src)
                value = c.child_by_field_name("value")
                used = {_text(src, i) for i in _walk(value) if i.type == "identifier"} if value is not None else set()
                if name and name not in params and used & set(params):
                    params[name] = kind
                    grew = True
        if not grew:
            return


def _root_identifier(node, src: bytes) -> str | None:
    """The variable an lvalue expression starts from: ``out`` in ``out[0].shape[7]``."""
    while node is not None:
        if node.type == "identifier":
            return _text(src, node)
        if node.type in ("field_expression", "subscript_expression"):
            node = node.child_by_field_name("argument")
        elif node.type in ("pointer_expression", "parenthesized_expression", "cast_expression"):
            node = node.child_by_field_name("argument") or node.child_by_field_name("value") or \
                (node.named_children[-1] if node.named_children else None)
        else:
            return None
    return None


def state_findings(root, src: bytes) -> list[Finding]:
    """Storage a candidate keeps from one call to the next, in the forms that hide from the
    file-scope and ``static`` rules of ``check_source``: static data members (``static inline``,
    of class templates too), variables inside templates and ``extern "C"``, extern variables with
    an initialiser (a definition), extern variables of the C library (``environ``), const
    pointers and references to writable storage, ``thread_local`` and ``mutable`` storage, writes
    into the ABI descriptors the candidate is handed (the runner's own tables, alive across
    calls), and files or the environment by other names than ``check_source``'s. Every call
    gets inputs and outputs of its own: a kernel that needs nothing from an earlier call keeps
    none of this."""
    out: list[Finding] = []

    def add(rule: str, msg: str, node) -> None:
        out.append(Finding(rule, "error", msg, node.start_point[0] + 1))

    for n in _walk(root):
        t = n.type
        if t in ("declaration", "field_declaration"):
            if _is_function_declaration(n) and not any(c.type == "init_declarator" for c in n.children):
                continue
            classes = _storage_classes(n, src)
            text = _text(src, n)
            name = _declarator_name(n, src) or "?"
            if "typedef" in text.split("=")[0].split():
                continue
            scope = _scope_kind(n)
            shared = "__shared__" in text.split("=")[0]
            if t == "field_declaration":
                if "mutable" in classes or any(c.type == "type_qualifier" and _text(src, c) == "mutable"
                                               for c in n.children):
                    add("no-state", f"mutable member {name}: writable state inside a const object persists across "
                        "calls", n)
                elif "static" in classes and _writable_storage(n, src):
                    add("no-state", f"static data member {name} is {_writable_storage(n, src)}: one copy shared "
                        "by every call, state that persists across calls", n)
                continue
            how = _writable_storage(n, src)
            if "extern" in classes and not any(c.type == "init_declarator" for c in n.children):
                if not shared and scope in ("file", "block"):
                    add("no-state", f"extern variable {name} is storage outside the candidate (the C library's "
                        "or the runner's): state that persists across calls", n)
                continue
            if shared:
                continue
            if re.search(r"\b__constant__\b", text.split("=")[0]):
                # device constants are read-only to a kernel; written from the host (no initialiser)
                # they are state, as check_source says at file scope
                if scope == "file" and not any(c.type == "init_declarator" for c in n.children):
                    add("no-state", f"__constant__ {name} is written at run time: state that persists across "
                        "calls", n)
                continue
            if scope == "file" and how:
                where = "__device__ " if re.search(r"\b(__device__|__managed__|__constant__)\b", text.split("=")[0]) else ""
                add("no-state", f"{where}global variable {name} is {how}: state that persists across calls", n)
            elif scope == "block" and ({"static", "thread_local"} & classes) and how:
                kind = "thread_local" if "thread_local" in classes else "static"
                add("no-state", f"{kind} variable {name} is {how}: state that persists across calls", n)
        elif t == "function_definition":
            params = _descriptor_params(n, src)
            if not params:
                continue
            body = n.child_by_field_name("body") or n
            _descriptor_aliases(body, src, params)
            for m in _walk(body):
                if m.type == "assignment_expression":
                    target = m.child_by_field_name("left")
                elif m.type == "update_expression":
                    target = m.child_by_field_name("argument")
                else:
                    continue
                fields = {_text(src, f.child_by_field_name("field")) for f in _walk(target)
                          if f.type == "field_expression" and f.child_by_field_name("field") is not None}
                root_name = _root_identifier(target, src)
                desc = params.get(root_name or "")
                if desc and fields & DESCRIPTOR_FIELDS[desc]:
                    add("no-state", f"writes {_text(src, target)}: the {desc} descriptors are the runner's own, "
                        "alive across calls, and read-only to a candidate", m)
        elif t == "call_expression":
            fn = n.child_by_field_name("function")
            short = (_text(src, fn) if fn is not None else "").split("<")[0].strip().split("::")[-1]
            if short in FILE_IO:
                add("no-io", f"calls {short}: candidates may not create, open or write files (state that "
                    "persists across calls)", n)
            elif short in ENVIRONMENT:
                add("no-io", f"calls {short}: candidates may not read or change the environment", n)
        elif t in ("identifier",) and _text(src, n) in ENVIRONMENT_NAMES:
            add("no-io", f"uses {_text(src, n)}: candidates may not read or change the environment", n)
        elif t in ("type_identifier", "qualified_identifier") and _text(src, n).split("::")[-1] in FILE_STREAMS:
            if n.type == "qualified_identifier" or n.parent is None or n.parent.type != "qualified_identifier":
                add("no-io", f"uses {_text(src, n)}: candidates may not open files", n)
    clean = _strip_comments(src.decode(errors="replace"))
    for m in re.finditer(r"const_cast\s*<[^>]*\bforge_(tensor|scalar)\b|\(\s*forge_(tensor|scalar)\s*\*\s*\)", clean):
        add_line = clean.count("\n", 0, m.start()) + 1
        out.append(Finding("no-state", "error", f"casts the const away from the forge_{m.group(1) or m.group(2)} "
                           "descriptors: they are the runner's own, alive across calls, and read-only to a "
                           "candidate", add_line))
    unique: dict[tuple[str, int | None, str], Finding] = {}
    for f in out:
        unique.setdefault((f.rule, f.line, f.message), f)
    return list(unique.values())


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]
