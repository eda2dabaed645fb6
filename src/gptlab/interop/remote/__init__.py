"""The hand-written half of a remote-code export: ``configuration_gptlab.py`` and ``modeling_gptlab.py``.

These files are templates, never imported by gptlab: ``gptlab.interop.hf_remote`` copies them beside
the modules it generates from ``gptlab.model`` (``gptlab.interop.remote_source``), where their
relative imports (``from .gptlab_model import ...``) resolve. They need ``transformers``; gptlab does not.
"""
