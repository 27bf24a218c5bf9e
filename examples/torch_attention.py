"""A transformer layer from torch.nn whose attention is a RedFuser kernel registered as a PyTorch op,
compiled with torch.compile(fullgraph=True), and checked against the same layer on PyTorch's own
scaled_dot_product_attention.

    python examples/torch_attention.py
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import redfuser as rf
import redfuser.torch
from redfuser.workloads import attention

fused_attention = redfuser.torch.op(rf.kernel(attention), "examples::attention")


class Layer(nn.Module):
    """Pre-norm self-attention and MLP; `attend` is the attention of [batch, heads, tokens, head_dim]."""

    def __init__(self, width: int = 64, heads: int = 4, attend=fused_attention) -> None:
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attend(q.contiguous(), k.contiguous(), v.contiguous())
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, width))
        return x + self.mlp(self.norm2(x))


def main() -> float:
    torch.manual_seed(0)
    ours = Layer().eval()
    stock = Layer(attend=F.scaled_dot_product_attention).eval()
    stock.load_state_dict(ours.state_dict())
    x = torch.randn(2, 100, 64)
    with torch.no_grad():
        got = torch.compile(ours, fullgraph=True)(x)
        want = stock(x)
    error = float((got - want).abs().max())
    print(f"RedFuser attention in a compiled nn layer: max |difference| from the stock layer {error:.2e}")
    assert error < 1e-4, error
    return error


if __name__ == "__main__":
    main()
