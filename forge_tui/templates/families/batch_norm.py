"""batch_norm in inference (running statistics, training=False): one pass, per-channel scale and
shift. CUDA modes: ``flat`` (the tensor as one flat array, a grid of a few waves striding over it)
and ``plane`` (a block row a (n, c) plane). The CUDA code is in batch_norm.cuh (device) and
batch_norm.cu (entry points), the C++ in batch_norm.cpp.
"""

from __future__ import annotations

from ...cards import Card, CardKind
from ...kernel_abi import CPU_CTYPE, ITEMSIZE
from ...kernels.common import CPU_COMMON, CUDA_COMMON
from ...kernels.device import DEFAULT_DEVICE, DeviceProps
from ...kernels.family import Family, Match, header
from ...kernels.source import KernelFile
from ..base import CTYPE, FLOAT_DTYPES, input_index, numel, vec_widths

CUH = KernelFile(__package__, "batch_norm.cuh")
CU = KernelFile(__package__, "batch_norm.cu")
CPP = KernelFile(__package__, "batch_norm.cpp")

BN_TARGETS = {  # op -> index of (weight, bias, running_mean, running_var), training flag index, eps index
    "aten.native_batch_norm.default": (1, 2, 3, 4, 5, 7),
    "aten._native_batch_norm_legit_no_training.default": (1, 2, 3, 4, None, 6),
    "aten.cudnn_batch_norm.default": (1, 2, 3, 4, 5, 7),
}


class BatchNorm(Family):
    name = "batch_norm"

    def match(self, card: Card) -> Match | None:
        nodes = card.program.get("nodes") or []
        if len(nodes) != 1 or nodes[0]["op"] not in BN_TARGETS:
            return None
        if card.kind == CardKind.OP:
            if any(numel(o.shape) for o in card.outputs[1:]):
                return None  # saved statistics would have to be written too
        elif card.outputs and (card.program.get("outputs") != [{"$node": 0, "out": 0}] or len(card.outputs) != 1):
            return None  # a module card (nn.BatchNorm2d) that returns the normalised output alone
        wi_, bi_, mi_, vi_, ti_, ei_ = BN_TARGETS[nodes[0]["op"]]
        a = nodes[0]["args"]
        if ti_ is not None and a[ti_] is not False:
            return None  # training mode
        xi = input_index(a[0])
        idx = [input_index(a[k]) for k in (wi_, bi_, mi_, vi_)]
        if xi is None or idx[2] is None or idx[3] is None:
            return None
        x = card.inputs[xi]
        if x.dtype not in FLOAT_DTYPES or len(x.shape) < 2 or not x.contiguous or not card.outputs[0].contiguous:
            return None
        hw = numel(x.shape[2:])
        return Match(self.name, card, {"x": xi, "w": idx[0], "b": idx[1], "rm": idx[2], "rv": idx[3],
                                       "eps": float(a[ei_]), "n": x.shape[0], "c": x.shape[1], "hw": hw,
                                       "tin": x.dtype, "tout": card.outputs[0].dtype,
                                       "tp": card.inputs[idx[2]].dtype})

    def _vecs(self, m: Match, mode: str = "plane") -> list[int]:
        """The vector widths of a mode: in ``plane`` a vector stays in one (n, c) plane; in
        ``flat`` it may straddle two (each element then finds its own channel)."""
        i = m.info
        n = i["hw"] if mode == "plane" else i["n"] * i["c"] * i["hw"]
        return vec_widths(n, ITEMSIZE[i["tin"]])

    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        if backend == "cpu":
            return {"chunk": [1, 4, 16]}
        return {"mode": ["flat", "plane"], "threads": [128, 256, 512, 1024],
                "vec": sorted(set(self._vecs(m, "flat")) | set(self._vecs(m, "plane")), reverse=True),
                "unroll": [1, 2, 4]}

    def valid(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        return backend == "cpu" or p["vec"] in self._vecs(m, p.get("mode", "plane"))

    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """On the GPU the flat mode first: a block a plane leaves most threads idle and runs
        many short waves where planes are small (ResNet's 14x14 and 7x7: on the H200, 18-30 µs a
        call in place for 6-26 MB, where a copy of the same bytes takes 2-6)."""
        if backend == "cpu":
            return {"chunk": 4}
        return {"mode": "flat", "threads": 256, "vec": self._vecs(m, "flat")[0], "unroll": 2}

    def passes(self, m: Match, p: dict) -> int:
        return 1

    def render(self, m: Match, p: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        return header(self.name, p, 1) + (self._cpu(m, p) if backend == "cpu" else self._cuda(m, p, device))

    def _param_ptrs(self, m: Match, tp: str) -> str:
        i = m.info
        return CU.inline("params", tp=tp, rm=i["rm"], rv=i["rv"],
                         w=f"(const {tp}*)in[{i['w']}].data" if i["w"] is not None else f"(const {tp}*)nullptr",
                         b=f"(const {tp}*)in[{i['b']}].data" if i["b"] is not None else f"(const {tp}*)nullptr")

    def _cpu(self, m: Match, p: dict) -> str:
        i, ct = m.info, CPU_CTYPE
        return CPU_COMMON + CPP.fill("entry", tx=ct[i["tin"]], to=ct[i["tout"]], tp=ct[i["tp"]], n=i["n"], c=i["c"],
                                     hw=i["hw"], chunk=p["chunk"], eps=f"(float){i['eps']!r}", x=i["x"],
                                     params=self._param_ptrs(m, "TP"))

    def _cuda(self, m: Match, p: dict, device: DeviceProps = DEFAULT_DEVICE) -> str:
        i = m.info
        threads, vec, unroll = p["threads"], p["vec"], p["unroll"]
        args = {"threads": threads, "unroll": unroll, "params": self._param_ptrs(m, "TP"), "eps": f'(float){i["eps"]!r}'}
        if p.get("mode", "plane") == "flat":
            total = i["n"] * i["c"] * i["hw"]
            wave = device.sms * (device.max_threads_per_sm // threads)  # blocks resident at once
            grid = min(-(-total // (threads * vec * unroll)), 4 * wave)
            grid1 = min(-(-total // (threads * unroll)), 4 * wave)
            in_plane = "true" if i["hw"] % vec == 0 else "false"
            return self._cuda_entry(m, CUH.section("flat"), vec, "",
                                    CU.inline("flat_launch", **args, vec=vec, in_plane=in_plane, grid=grid),
                                    CU.inline("flat_launch", **args, vec=1, in_plane="true", grid=grid1))
        setup = CU.fill("plane_setup", blocks_per_plane=-(-i["hw"] // (threads * vec * unroll)))
        return self._cuda_entry(m, CUH.section("plane"), vec, setup, CU.inline("plane_launch", **args, vec=vec),
                                CU.inline("plane_launch", **args, vec=1))

    @staticmethod
    def _cuda_entry(m: Match, kernel: str, vec: int, setup: str, launch: str, scalar_launch: str) -> str:
        """A CUDA batch norm candidate: ``kernel``, then forge_launch checking the card's sizes and
        launching ``launch`` where input and output are aligned to ``vec`` elements, else
        ``scalar_launch``."""
        i, ct = m.info, CTYPE
        return CUDA_COMMON + kernel + CU.fill("entry", tx=ct[i["tin"]], to=ct[i["tout"]], tp=ct[i["tp"]], n=i["n"],
                                              c=i["c"], hw=i["hw"], x=i["x"], setup=setup, vec=vec, launch=launch,
                                              scalar_launch=scalar_launch)
