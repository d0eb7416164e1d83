"""The engine's decode pass on fused CPU kernels (cpu_kernels.c) and matrix products.

A decode pass of the trainer's Transformer is about thirty PyTorch operators per layer;
for a small model on a few cores their dispatch and memory passes outweigh the
arithmetic. This pass computes the same function with, per layer, four products (q/k/v
fused, o, gate/up fused, down) and three kernel calls (RMSNorm; RoPE + K/V write +
attention over the decode-cache row; SiLU-and-multiply), and samples in one more call.
It reads the model's own norm and embedding tensors and large layers; small projection
weights get fused, transposed copies (_Product), which `refresh()` rebuilds after every
weight update.

When every weight has such a copy (a small model, like the built-in one) and the torch
build exports BLAS sgemm (MKL builds do), the layer loop itself runs in C: one
`decode_pass` call per pass, embedding to logits, instead of about ten Python-side
calls per layer, which removes their dispatch. That is the same arithmetic, bit for bit
(sgemm is what torch.mm calls); `burst` runs a whole decode burst, sampling included,
in one call. Otherwise the loop runs here in Python, as for large models whose products
go through oneDNN-packed weights (packed_linear.py). In an int8 engine (int8_linear.py) every product
runs in cpu_kernels.c's q8_matmul on int8 weights, inside the whole-pass loop too. bench/decode_pass.py times the
parts of a pass and the two loops.

Equivalence with the model's forward pass is tested (tests/test_engine_fused.py):
logits agree to float32 rounding, greedy decoding gives the same tokens, and the
engine's logprobs match the trainer's recomputation. The arithmetic is not bit-identical
(other summation orders, a polynomial exp), so an engine whose decode backend is this
pass (decode_backend.py) runs every decode step through it, never a mix, and prefill
chunks always through the model's forward.

Used when the model is float32 on CPU, of the plain Llama/Qwen2 shape (q/k/v biases
allowed; no q/k norms), with a decode cache and the kernels built (cpu_kernels.load).
Otherwise `unsupported` names the reason and the engine keeps to the model's forward.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn as nn
from torch import Tensor

from polyrl.engine.runner.cpu_kernels import DecodeArgs, DecodeLayer, blas_sgemm
from polyrl.engine.runner.decode_cache import DecodeCache
from polyrl.engine.runner.int8_linear import Int8Linear, Int8Weight
from polyrl.engine.runner.kv_int8 import Int8KVPool
from polyrl.engine.runner.packed_linear import MIN_PACKED_ELEMENTS
from polyrl.models.transformer import Transformer

MAX_HEAD_DIM = 512  # cpu_kernels.c's rope_attend keeps its rotated queries on the stack
ATTEND_GROUP = 4  # cpu_kernels.c's GROUP: query heads attended together, each with its own scores


def unsupported(model: Transformer) -> str | None:
    """Why the fused pass cannot run this model, or None when it can."""
    cfg = model.cfg
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype != torch.float32:
        return f"fused decode needs float32 weights on CPU, not {p.dtype} on {p.device.type}"
    if cfg.qk_norm:
        return "fused decode does not cover q/k norms (Qwen3)"
    if cfg.head_dim % 2 or cfg.head_dim > MAX_HEAD_DIM:
        return f"fused decode needs an even head_dim <= {MAX_HEAD_DIM}, not {cfg.head_dim}"
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return "num_attention_heads must be a multiple of num_key_value_heads"
    if model.rope.per_call:
        return "dynamic NTK RoPE recomputed per call (rope.dynamic_length=None) cannot use cached RoPE tables"
    return None


class _Product:
    """x @ W.T (+ b) over one or more of the model's linear layers, outputs side by side.

    Small weights (the built-in model's all) run as one fused, transposed copy through
    torch.mm into a reused buffer: one call instead of three. Large ones run through the
    model's own modules, oneDNN-packed where the engine packed them (packed_linear.py),
    so a big model's weights are never copied again. In an int8 engine (the model's
    layers are Int8Linear, int8_linear.py) the fused copy of small weights is int8 too (q)."""

    def __init__(self, linears: list[nn.Module]) -> None:
        self.linears = linears
        self.out_features = sum(m.out_features for m in linears)
        self.wt = self.bias = self.q = None
        if sum(m.weight.numel() for m in linears) < MIN_PACKED_ELEMENTS:
            weight = torch.cat([m.weight.detach() for m in linears])  # (out, in)
            if isinstance(linears[0], Int8Linear):  # per-channel scales: fusing first changes nothing
                assert all(isinstance(m, Int8Linear) and m.scheme == linears[0].scheme for m in linears)
                self.q = Int8Weight(weight, linears[0].lib, linears[0].scheme)
            else:
                self.wt = weight.t().contiguous()  # (in, out)
            if any(m.bias is not None for m in linears):
                self.bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                                       for m in linears])

    def __call__(self, x: Tensor, out: Tensor) -> Tensor:
        """x (rows, in) -> (rows, out_features), into `out` where it can."""
        if self.q is not None:
            return self.q.matmul(x, out, self.bias)
        if self.wt is None:
            ys = [m(x) for m in self.linears]
            return ys[0] if len(ys) == 1 else torch.cat(ys, dim=1, out=out)
        if self.bias is None:
            return torch.mm(x, self.wt, out=out)
        return torch.addmm(self.bias, x, self.wt, out=out)

    def add_to(self, x: Tensor, y: Tensor) -> None:
        """x += y @ W.T (+ b), in place: the residual (a single layer)."""
        if self.q is not None:
            self.q.matmul(y, x, self.bias, accumulate=True)
            return
        if self.wt is None:
            x.add_(self.linears[0](y))
            return
        x.addmm_(y, self.wt)
        if self.bias is not None:
            x.add_(self.bias)


class FusedDecoder:
    def __init__(self, model: Transformer, cache: DecodeCache, lib: ctypes.CDLL, whole_pass: bool = True) -> None:
        """whole_pass=False keeps to the layer loop in Python even where decode_pass could
        run (tests pin the two equal; bench/decode_pass.py times both)."""
        reason = unsupported(model)
        assert reason is None, reason
        self.model, self.cache, self.lib, self.whole_pass = model, cache, lib, whole_pass
        cfg = model.cfg
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = float(cfg.rms_norm_eps)
        self.scale = float(self.hd ** -0.5)
        # A bare cache of rows (tests, bench/decode_pass.py) has no pool: float.
        self.kv_q8 = int(isinstance(getattr(cache, "pool", None), Int8KVPool))
        """1 with an int8 KV pool: new K/V go to the rows as the pool gives them back (kv_int8.py)."""
        self.cos = self.sin = torch.empty(0, self.hd)
        self.buffers: dict[str, Tensor] = {}
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Rebuild the fused weight copies from the model's current weights (after the
        engine has repacked its packed layers)."""
        self.layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm.weight, _Product([a.q_proj, a.k_proj, a.v_proj]),
                                _Product([a.o_proj]), layer.post_attention_layernorm.weight,
                                _Product([m.gate_proj, m.up_proj]), _Product([m.down_proj])))
        self.head = _Product([self.model.lm_head])
        q8 = [p.q for layer in self.layers for p in layer if isinstance(p, _Product) and p.q is not None]
        self._q8_cols = max((q.Kp for q in q8 + ([self.head.q] if self.head.q is not None else [])), default=0)
        """The widest input of an int8 product (0: none): the width of q8_matmul's scratch."""
        self.whole = self._whole_pass()

    def _whole_pass(self) -> DecodeArgs | None:
        """The weight half of decode_pass's arguments, when the whole pass can run in one C
        call: every product has a fused copy (a small model) and this torch exports sgemm_."""
        products = [p for layer in self.layers for p in layer if isinstance(p, _Product)] + [self.head]
        if not self.whole_pass or any(p.wt is None and (p.q is None or p.q.lib is None) for p in products):
            return None
        sgemm = blas_sgemm()
        if isinstance(sgemm, str):
            return None

        def addr(t: Tensor | None) -> int:
            return 0 if t is None else t.data_ptr()

        def q8(p: _Product) -> int:  # the int8 weight's struct, kept alive by p.q
            return 0 if p.q is None else ctypes.addressof(p.q.struct)

        self._layer_args = (DecodeLayer * len(self.layers))(*[
            DecodeLayer(addr(n1), addr(qkv.wt), addr(qkv.bias), addr(o.wt), addr(o.bias), addr(n2), addr(gu.wt),
                        addr(gu.bias), addr(down.wt), addr(down.bias), q8(qkv), q8(o), q8(gu), q8(down))
            for n1, qkv, o, n2, gu, down in self.layers])
        cfg = self.model.cfg
        return DecodeArgs(sgemm=sgemm, layers=ctypes.addressof(self._layer_args), n_layers=len(self.layers),
                          D=cfg.hidden_size, nh=self.nh, nkv=self.nkv, hd=self.hd, inter=cfg.intermediate_size,
                          V=self.head.out_features, eps=self.eps, scale=self.scale, kv_q8=self.kv_q8,
                          embed=self.model.model.embed_tokens.weight.data_ptr(),
                          final_norm=self.model.model.norm.weight.data_ptr(), whead=addr(self.head.wt),
                          bhead=addr(self.head.bias), qhead=q8(self.head))

    @torch.inference_mode()
    def logits(self, ids: Tensor, pos: Tensor, rows: Tensor) -> Tensor:
        """One decode token per sequence: ids, pos, rows (S,) long (token, its position, its
        decode-cache row, whose positions < pos must hold the context) -> logits (S, V)
        float32. Writes each layer's new K/V into the rows at pos."""
        lib, S = self.lib, ids.shape[0]
        ids, pos, rows = ids.contiguous(), pos.contiguous(), rows.contiguous()  # named: C reads them
        self._check(pos, rows)
        logits = torch.empty(S, self.head.out_features)  # returned: the caller may keep it
        if self.whole is not None:
            lib.decode_pass(ctypes.byref(self._whole_args(ids, pos, rows, logits)))
            return logits
        kc, vc = self.cache.k, self.cache.v  # (layers, rows, nkv, L, hd)
        L = kc.shape[3]
        x = self.model.model.embed_tokens.weight.index_select(0, ids)  # (S, D), the residual stream
        D = x.shape[1]
        h = self._buffer("h", S, D)
        attn = self._buffer("attn", S, self.nh * self.hd)
        threads = self.threads()
        scores = self._buffer_ptr("scores", threads, ATTEND_GROUP * L)
        layer_bytes = kc.stride(0) * kc.element_size()
        for i, (norm1, qkv, o, norm2, gate_up, down) in enumerate(self.layers):
            lib.rms_norm(x.data_ptr(), norm1.data_ptr(), h.data_ptr(), S, D, self.eps)
            q = qkv(h, self._buffer("qkv", S, qkv.out_features))
            lib.rope_attend(q.data_ptr(), S, self.nh, self.nkv, self.hd, self.cos.data_ptr(), self.sin.data_ptr(),
                            pos.data_ptr(), rows.data_ptr(), kc.data_ptr() + i * layer_bytes,
                            vc.data_ptr() + i * layer_bytes, L, attn.data_ptr(), self.scale, scores, self.kv_q8,
                            threads)
            o.add_to(x, attn)
            lib.rms_norm(x.data_ptr(), norm2.data_ptr(), h.data_ptr(), S, D, self.eps)
            gu = gate_up(h, self._buffer("gate_up", S, gate_up.out_features))
            act = self._buffer("act", S, gu.shape[1] // 2)
            lib.silu_mul(gu.data_ptr(), act.data_ptr(), S, act.shape[1], threads)
            down.add_to(x, act)
        lib.rms_norm(x.data_ptr(), self.model.model.norm.weight.data_ptr(), h.data_ptr(), S, D, self.eps)
        return self.head(h, logits)

    @torch.inference_mode()
    def burst(self, ids: Tensor, pos: Tensor, rows: Tensor, temperature: Tensor, u: Tensor, stop: Tensor,
              keep: Tensor) -> tuple[Tensor, Tensor, int]:
        """Up to K passes and their samples in one C call (decode_burst; needs `whole`, and
        rows that `sample` covers): ids (S,) the first pass's tokens, pos (K, S), rows (S,),
        temperature (S,), u (K, S) float64, stop (S, m) stop ids padded with -1, keep (S,)
        the passes each row may keep. Stops once every row has sampled a stop id or reached
        its keep. -> tokens (K, S) long, logprobs (K, S), the passes run (rows past them
        undefined). The same tokens as `logits` then `sample` pass by pass."""
        assert self.whole is not None, "burst needs the whole pass in C"
        assert ids.dtype == pos.dtype == rows.dtype == stop.dtype == keep.dtype == torch.long
        assert temperature.dtype == torch.float32 and u.dtype == torch.float64
        K, S = pos.shape
        ids, pos, rows, stop = ids.contiguous(), pos.contiguous(), rows.contiguous(), stop.contiguous()
        self._check(pos, rows)
        args = self._whole_args(ids, pos, rows, self._buffer("logits", S, self.head.out_features))
        tokens, logprobs = torch.empty(K, S, dtype=torch.long), torch.empty(K, S)
        done = torch.empty(S, dtype=torch.uint8)  # named: alive until the call returns
        temperature, u, keep = temperature.contiguous(), u.contiguous(), keep.contiguous()
        passes = self.lib.decode_burst(
            ctypes.byref(args), K, pos.data_ptr(), temperature.data_ptr(), u.data_ptr(), stop.data_ptr(),
            stop.shape[1], keep.data_ptr(), tokens.data_ptr(), logprobs.data_ptr(),
            self._buffer_ptr("work", args.threads, self.head.out_features), done.data_ptr())
        return tokens, logprobs, passes

    def threads(self) -> int:
        """Threads for the per-row kernels: torch's intra-op threads, read per call (a data-parallel
        worker sets its own), where the kernels were built with OpenMP; else one."""
        return torch.get_num_threads() if getattr(self.lib, "threaded", False) else 1

    def _check(self, pos: Tensor, rows: Tensor) -> None:
        """Refuse positions or rows outside the decode cache (C would write out of bounds);
        extend the RoPE tables to cover pos."""
        kc = self.cache.k
        last = int(pos.max())
        if last >= kc.shape[3] or int(rows.max()) >= kc.shape[1] or int(pos.min()) < 0:
            raise IndexError(f"decode cache {tuple(kc.shape)} cannot hold positions up to {last} "
                             f"in rows up to {int(rows.max())}")
        self._rope_tables(last + 1)

    def _whole_args(self, ids: Tensor, pos: Tensor, rows: Tensor, logits: Tensor) -> DecodeArgs:
        """decode_pass's arguments for this call (contiguous ids, pos, rows; logits (S, V)).
        The struct holds bare addresses: the caller keeps every tensor alive until C returns."""
        a, S, kc = self.whole, ids.shape[0], self.cache.k
        bufs = {"x": a.D, "h": a.D, "qkv": (self.nh + 2 * self.nkv) * self.hd, "attn": self.nh * self.hd,
                "gu": 2 * a.inter, "act": a.inter}
        for name, cols in bufs.items():
            setattr(a, name, self._buffer_ptr(name, S, cols))
        a.threads = self.threads()
        a.scores = self._buffer_ptr("scores", a.threads, ATTEND_GROUP * kc.shape[3])
        a.S, a.L, a.layer_stride = S, kc.shape[3], kc.stride(0)
        a.ids, a.pos, a.rows = ids.data_ptr(), pos.data_ptr(), rows.data_ptr()
        a.cos_t, a.sin_t, a.kc, a.vc = self.cos.data_ptr(), self.sin.data_ptr(), kc.data_ptr(), self.cache.v.data_ptr()
        a.logits = logits.data_ptr()
        if self._q8_cols:  # int8 products: q8_matmul's scratch, as wide as the widest input
            a.xq = self._buffer_ptr("xq", S, -(-self._q8_cols // 4))  # float32 columns: 4 bytes each
            a.xs = self._buffer_ptr("xs", S, 1)
        return a

    def _buffer(self, name: str, rows: int, cols: int) -> Tensor:
        """A reused (rows, cols) float32 scratch tensor (contents undefined)."""
        return self._whole_buffer(name, rows, cols)[:rows]

    def _buffer_ptr(self, name: str, rows: int, cols: int) -> int:
        """The address of _buffer(name, rows, cols), without making the view (C only needs where it starts)."""
        return self._whole_buffer(name, rows, cols).data_ptr()

    def _whole_buffer(self, name: str, rows: int, cols: int) -> Tensor:
        buf = self.buffers.get(name)
        if buf is None or buf.shape[1] != cols or buf.shape[0] < rows:
            buf = self.buffers[name] = torch.empty(max(rows, 64), cols)
        return buf

    def sample(self, logits: Tensor, temperature: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """sampler.sample_batch without top-k/top-p: logits (M, V) float32, temperature (M,)
        float32 (0 = greedy), u (M,) float64 -> tokens (M,) long, logprobs (M,)."""
        logits, temperature, u = logits.contiguous(), temperature.contiguous(), u.contiguous()
        M, V = logits.shape
        tokens = torch.empty(M, dtype=torch.long)
        logprobs = torch.empty(M)
        threads = self.threads()
        work = torch.empty(threads, V)
        self.lib.sample_rows(logits.data_ptr(), M, V, temperature.data_ptr(), u.data_ptr(), tokens.data_ptr(),
                             logprobs.data_ptr(), work.data_ptr(), threads)
        return tokens, logprobs

    def _rope_tables(self, positions: int) -> None:
        """cos/sin tables (P, hd) covering `positions`, exactly as the model computes them."""
        if positions <= self.cos.shape[0]:
            return
        P = max(positions, 2 * self.cos.shape[0], 256)
        cos, sin = self.model.rope.cos_sin(torch.arange(P)[None], torch.float32)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()
