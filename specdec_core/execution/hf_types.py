"""The type of a transformers model or one of its submodules, as the code that walks it sees it.

transformers' modules expose their children and config as dynamic attributes
(``layer.self_attn.q_proj``, ``model.config.num_attention_heads``), which a type checker can only
read as ``Tensor | Module``; code that walks a transformers model annotates it as ``HFModule``.
"""

from typing import Any

HFModule = Any
