"""``gptlab attention CKPT "text" [--layer L] [--head H] -o attn.png`` (argument parsing only)."""

from __future__ import annotations

import argparse

from gptlab.cli.options import add_device_argument, add_model_argument, device_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "attention",
        help="draw attention maps labelled with tokens",
        description="One head (--layer and --head), every head of a layer (--layer), or a layers × heads "
        "overview (neither). Layers and heads count from 0.",
    )
    add_model_argument(p)
    p.add_argument("text", nargs="?", help="the input text")
    p.add_argument("--ids", help='token ids instead of text, e.g. "464 2415 3332 319"')
    p.add_argument(
        "--stage",
        choices=["cross", "encoder", "decoder"],
        default="cross",
        help="encoder-decoder models: cross-attention (target × source, default), encoder or decoder maps",
    )
    p.add_argument("--target", help="encoder-decoder: the target text (default: the model's greedy output)")
    p.add_argument("--layer", type=int, help="layer index (0-based)")
    p.add_argument("--head", type=int, help="head index (0-based); needs --layer")
    p.add_argument(
        "-o", "--output", default="attention.png", help="image file (.png, .svg, .pdf; default attention.png)"
    )
    add_device_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gptlab.errors import GptlabError
    from gptlab.inspect.attention import attention_maps, seq2seq_maps
    from gptlab.inspect.inputs import cli_input, load_checkpoint, token_ids, token_labels
    from gptlab.inspect.plots import image_format, plot_head, plot_layer, plot_overview
    from gptlab.model import EncoderDecoder

    if args.head is not None and args.layer is None:
        raise GptlabError("--head needs --layer (for every layer's heads, leave out both)")
    image_format(args.output)  # a bad file name fails before the model is loaded
    text = cli_input(args.text, args.ids)
    model, tokenizer = load_checkpoint(args.checkpoint, device_from_args(args))
    ids = token_ids(model, tokenizer, text)
    cols, causal = None, bool(model.config.causal)  # a bool once the config is built
    if isinstance(model, EncoderDecoder):  # arch="encoder-decoder": the text is the source
        found = seq2seq_maps(model, tokenizer, ids, args.target)
        maps, causal = found[args.stage], args.stage == "decoder"
        src, tgt = (token_labels(tokenizer, found[k]) for k in ("source_ids", "target_ids"))
        labels, cols = {"cross": (tgt, src), "encoder": (src, None), "decoder": (tgt, None)}[args.stage]
    else:
        maps = attention_maps(model, ids)
        labels = token_labels(tokenizer, ids)
    if args.layer is None:
        size = plot_overview(maps, args.output, causal)
    elif args.head is None:
        size = plot_layer(maps, labels, args.layer, args.output, cols, causal)
    else:
        size = plot_head(maps, labels, args.layer, args.head, args.output, cols, causal)
    print(
        f"wrote {args.output} ({size[0]}×{size[1]} px; {maps.size(0)} layers × {maps.size(1)} heads, "
        f"{maps.size(2)} × {maps.size(3)} tokens)"
    )
    return 0
