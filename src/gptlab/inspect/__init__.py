"""See inside the model: the pipeline trace, attention maps, the logit lens, and a size and cost calculator.

The playground's Inside view reads ``gptlab.inspect.inside.inside`` (every stage of one pass).

>>> from gptlab.inspect import trace, attention_maps, size_report
>>> print(trace(model, tokenizer, "The cat sat on").render())        # doctest: +SKIP
>>> attention_maps(model, tokenizer, "The cat sat on").shape         # doctest: +SKIP
torch.Size([L, H, T, T])
>>> print(size_report(GPTConfig.preset("gpt2"), context=1024).render())  # doctest: +SKIP
"""

from gptlab.inspect.attention import attention_maps
from gptlab.inspect.lens import logit_lens
from gptlab.inspect.plots import plot_head, plot_layer, plot_overview
from gptlab.inspect.size import SizeReport, count_parameters, size_report
from gptlab.inspect.tracing import Trace, trace

__all__ = [
    "SizeReport",
    "Trace",
    "attention_maps",
    "count_parameters",
    "logit_lens",
    "plot_head",
    "plot_layer",
    "plot_overview",
    "size_report",
    "trace",
]
