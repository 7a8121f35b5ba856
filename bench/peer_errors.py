"""Peer-equivalence errors of the converters: our converted models vs min-dalle 0.4.11 and transformers' CLIPModel.

min-dalle 0.4.11's PyTorch `DalleBartEncoder`, `DalleBartDecoder` and `VQGanDetokenizer`, and transformers' PyTorch
`CLIPModel`, are built with random weights (norms too); their state dicts are saved to files, converted with
`dalle_nb.convert`, and the outputs compared on the same inputs: encoder states, decoder logits for a token prefix,
super-conditioned logits, greedy tokens (min-dalle's own KV-cached loop against our `generate`), decoded images, CLIP
embeddings and logits. Prints a markdown table of the maximum relative errors (max |ours - theirs| / max |theirs|)
for BENCHMARKS.md; `--out` also writes them to peer_errors.json (tests/test_peers.py asserts on that file). CPU, torch
is imported inside the functions (it imports slowly).

    python bench/peer_errors.py            # the small configurations (what tests/test_peers.py checks by default)
    python bench/peer_errors.py --full     # also DALL·E Mini's and Mega's widths, the full 256 px VQGAN decoder, CLIP ViT-B/32
    python bench/peer_errors.py --only clip-small --out /tmp/peers   # one comparison (a key, or part of a name)
"""
import argparse, datetime, json, platform, sys, tempfile, time
from dataclasses import replace
from pathlib import Path

import numpy as np
import jax.numpy as jnp

from dalle_nb.config import BartConfig, F16_VQGAN
from dalle_nb.convert import read_torch, bart_from_min_dalle, vqgan_from_min_dalle, build_model
from dalle_nb.published import load_clip
from dalle_nb.bart import DalleBart, text_mask
from dalle_nb.vqgan import VQGAN
from dalle_nb.sample import supercondition, generate, row_keys

# min-dalle fixes 256 image positions and samples among the first 2**14 ids; the rest of the sizes are small
SMALL_BART = BartConfig(text_vocab=300, image_codes=16384, image_vocab=16384, max_text_len=12, image_len=256, d_model=64,
                        encoder_layers=2, decoder_layers=2, heads=4, glu_dim=96)
# Mega's depth at a small width: 24 + 24 layers, so layer 10 must follow layer 9 (not layer 1) through the converter
DEEP_BART = BartConfig(text_vocab=300, image_codes=16384, image_vocab=16384, max_text_len=12, image_len=256, d_model=32,
                       encoder_layers=24, decoder_layers=24, heads=2, glu_dim=48)
# DALL·E Mini's widths, heads and vocabularies (two layers a side instead of twelve)
MINI_WIDTH_BART = BartConfig(text_vocab=50264, image_codes=16384, image_vocab=16384, max_text_len=64, image_len=256,
                             d_model=1024, encoder_layers=2, decoder_layers=2, heads=16, glu_dim=2730)
# DALL·E Mega's widths, heads and vocabularies (two layers a side instead of twenty-four: every tensor shape of a layer is real)
MEGA_WIDTH_BART = BartConfig(text_vocab=50272, image_codes=16384, image_vocab=16415, max_text_len=64, image_len=256,
                             d_model=2048, encoder_layers=2, decoder_layers=2, heads=32, glu_dim=4096)


def rel_err(ours, theirs) -> float:
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def _torch():
    try: import torch
    except ImportError as e: raise SystemExit(f"peer_errors.py needs the dev extra (torch==2.13.0, min-dalle 0.4.11, transformers): {e}")
    return torch


def _randomise(module, seed: int):
    "Random norms as well as weights (torch initialises norms to 1/0, which would hide a scale/bias mix-up)."
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if isinstance(_owner(module, name), (torch.nn.LayerNorm, torch.nn.GroupNorm)):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim >= 2 and "embed" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(np.prod(p.shape[1:])))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return module


def _owner(module, name):
    for part in name.split(".")[:-1]: module = getattr(module, part) if not part.isdigit() else module[int(part)]
    return module


def min_dalle_bart(cfg: BartConfig, tmp: Path, seed: int = 0):
    "min-dalle's encoder and decoder at `cfg`'s sizes, random, saved as encoder.pt / decoder.pt; and our converted BART."
    torch = _torch()
    from min_dalle.models import DalleBartEncoder, DalleBartDecoder
    enc = _randomise(DalleBartEncoder(layer_count=cfg.encoder_layers, embed_count=cfg.d_model, attention_head_count=cfg.heads,
                                      text_vocab_count=cfg.text_vocab, text_token_count=cfg.max_text_len,
                                      glu_embed_count=cfg.glu_dim, device="cpu"), seed).eval()
    dec = _randomise(DalleBartDecoder(image_vocab_count=cfg.image_vocab, embed_count=cfg.d_model, attention_head_count=cfg.heads,
                                      glu_embed_count=cfg.glu_dim, layer_count=cfg.decoder_layers, device="cpu"), seed + 1).eval()
    torch.save(enc.state_dict(), tmp / "encoder.pt"); torch.save(dec.state_dict(), tmp / "decoder.pt")
    ours = build_model(DalleBart, cfg, bart_from_min_dalle(read_torch(tmp / "encoder.pt"), read_torch(tmp / "decoder.pt"), cfg), tmp)
    return enc, dec, ours


def _texts(cfg: BartConfig, seed=0):
    "Row 0: the empty caption (`<s></s>` + padding), row 1: a caption — min-dalle's (uncond, cond) order."
    rng = np.random.default_rng(seed)
    ids = np.ones((2, cfg.max_text_len), np.int64)
    ids[0, :2] = [0, 2]
    n = cfg.max_text_len // 2
    ids[1, :n] = [0, *rng.integers(4, cfg.text_vocab, n - 2), 2]
    return ids


def measure_bart(cfg: BartConfig, tmp: Path, scale: float = 10.0, prefix_len: int = 24, greedy_steps: int = 16) -> dict:
    torch = _torch()
    enc, dec, ours = min_dalle_bart(cfg, tmp)
    text = _texts(cfg)
    rng = np.random.default_rng(1)
    prefix = np.concatenate([[cfg.bos_id], rng.integers(0, cfg.image_codes, prefix_len - 1)])[None]
    with torch.no_grad():
        t_text = torch.tensor(text)
        their_enc = enc(t_text)
        mask = t_text.ne(1)[:, None, None, :]
        state = torch.zeros(cfg.decoder_layers, 4, 256, cfg.d_model)
        their_logits, _ = dec(attention_mask=mask, encoder_state=their_enc, attention_state=state,
                              prev_tokens=torch.tensor(prefix), token_index=torch.arange(prefix_len))
        their_enc, their_logits = their_enc.numpy(), their_logits.numpy()
        # min-dalle's own KV-cached greedy loop (top-k 1), started from our BOS
        tokens = torch.full((1, greedy_steps + 1), cfg.bos_id, dtype=torch.long)
        state = torch.zeros(cfg.decoder_layers, 4, 256, cfg.d_model)
        settings = torch.tensor([1.0, 1.0, scale])
        for i in range(greedy_steps):
            tokens[:, i + 1], state = dec.sample_tokens(settings=settings, attention_mask=mask, encoder_state=torch.tensor(their_enc),
                                                        attention_state=state, prev_tokens=tokens[:, [i]], token_index=torch.arange(256)[[i]])
        their_greedy = tokens[0, 1:].numpy()
    our_enc = np.asarray(ours.encoder(jnp.asarray(text)))
    our_logits = np.asarray(ours.decoder(jnp.asarray(np.repeat(prefix, 2, 0)), jnp.asarray(our_enc), text_mask(jnp.asarray(text), cfg.pad_id)))
    # super conditioning: theirs is uncond·(1−s) + cond·s on their logits; ours `supercondition` on ours
    theirs_mixed = their_logits[0, :, :2 ** 14] * (1 - scale) + their_logits[1, :, :2 ** 14] * scale
    ours_mixed = np.asarray(supercondition(our_logits[1, :, :cfg.image_codes], our_logits[0, :, :cfg.image_codes], scale))
    our_greedy = np.asarray(generate(ours, text[1:], row_keys(0, 1), blank_ids=text[:1], cond_scale=scale, top_k=1))[0, :greedy_steps]
    return {"encoder_states": rel_err(our_enc, their_enc), "decoder_logits": rel_err(our_logits, their_logits),
            "supercond_logits": rel_err(ours_mixed, theirs_mixed), "greedy_ours": our_greedy.tolist(), "greedy_theirs": their_greedy.tolist()}


def _detokenizer(seed: int = 0):
    torch = _torch()
    from min_dalle.models import VQGanDetokenizer
    return _randomise(VQGanDetokenizer(), seed).eval()


def measure_vqgan(tmp: Path, grid: int = 4, seed: int = 0) -> dict:
    "min-dalle's full-width decoder (random) on a `grid`×`grid` code map, run step by step as its forward does."
    torch = _torch()
    detok = _detokenizer(seed)
    torch.save(detok.state_dict(), tmp / "detoker.pt")
    # attention sits at the lowest level (16×16 for 256 px): at 4×4 codes, that level is 4×4; min-dalle's GroupNorm eps
    cfg = replace(F16_VQGAN, resolution=16 * grid, attn_resolutions=(grid,), norm_eps=1e-5, decoder_only=True)
    ours = build_model(VQGAN, cfg, vqgan_from_min_dalle(read_torch(tmp / "detoker.pt"), cfg), tmp)
    ids = np.random.default_rng(seed).integers(0, 2 ** 14, (2, grid * grid))
    with torch.no_grad():
        z = detok.embedding(torch.tensor(ids)).view(2, grid, grid, 256).permute(0, 3, 1, 2)
        raw = detok.decoder(detok.post_quant_conv(z)).permute(0, 2, 3, 1).numpy()
    ours_raw = np.asarray(ours.decode_latents(ours.quantize.embed(jnp.asarray(ids).reshape(2, grid, grid))))
    return {"decoder_output": rel_err(ours_raw, raw), "image": rel_err(np.asarray(ours.decode(jnp.asarray(ids))), np.clip(raw, 0, 1))}


def measure_vqgan_full(tmp: Path, seed: int = 0) -> dict:
    "The whole `VQGanDetokenizer.forward` (256 codes → 256×256×3 in 0..255) against ours; and the eps 1e-5/1e-6 gap."
    torch = _torch()
    detok = _detokenizer(seed)
    torch.save(detok.state_dict(), tmp / "detoker.pt")
    sd = read_torch(tmp / "detoker.pt")
    ids = np.random.default_rng(seed).integers(0, 2 ** 14, (1, 256))
    with torch.no_grad(): theirs = detok.forward(False, torch.tensor(ids)).numpy()
    out = {}
    for eps in (1e-5, 1e-6):
        cfg = replace(F16_VQGAN, norm_eps=eps, decoder_only=True)
        img = np.asarray(build_model(VQGAN, cfg, vqgan_from_min_dalle(sd, cfg), tmp).decode(jnp.asarray(ids)))[0] * 255
        out[f"image_eps_{eps:g}"] = rel_err(img, theirs)
    return out


def transformers_clip(tmp: Path, real_size: bool = False, seed: int = 0):
    "transformers' CLIPModel (random), saved with `save_pretrained` plus a CLIP tokenizer; and ours via `load_clip`."
    torch = _torch()
    from transformers import CLIPConfig as HFCLIPConfig, CLIPModel
    torch.manual_seed(seed)
    if real_size: hf_cfg = HFCLIPConfig(text_config={"eos_token_id": 49407}, projection_dim=512)   # ViT-B/32's sizes
    else:
        hf_cfg = HFCLIPConfig(text_config=dict(vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, max_position_embeddings=16, eos_token_id=599),
                              vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                                 image_size=32, patch_size=8), projection_dim=32)
    model = CLIPModel(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layrnorm" in name or "layernorm" in name:
                p.add_(0.2 * torch.randn(p.shape))
    model.save_pretrained(tmp)
    _clip_vocab(tmp, hf_cfg.text_config.vocab_size)
    clip, text = load_clip(tmp)
    return model, clip, text, hf_cfg


def _clip_vocab(d: Path, size: int):
    "A CLIP-format vocab.json/merges.txt of exactly `size` ids (bytes, their `</w>` forms, merges, then the specials)."
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    toks = alphabet + [c + "</w>" for c in alphabet]
    merges = [("c", "a"), ("ca", "t</w>"), ("d", "o"), ("do", "g</w>")]
    toks += [a + b for a, b in merges]
    toks += [f"x{i}</w>" for i in range(size - len(toks) - 2)] + ["<|startoftext|>", "<|endoftext|>"]   # eos = size - 1
    (d / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(toks)}))
    (d / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))


def measure_clip(tmp: Path, real_size: bool = False) -> dict:
    torch = _torch()
    model, clip, text, hf_cfg = transformers_clip(tmp, real_size)
    size = hf_cfg.vision_config.image_size
    images = np.random.default_rng(0).random((2, size, size, 3)).astype(np.float32)
    ids = text(["a cat", "a dog cat"])
    from dalle_nb.clip import preprocess
    pixels = torch.tensor(np.asarray(preprocess(images, size))).permute(0, 3, 1, 2)
    with torch.no_grad(): out = model(input_ids=torch.tensor(ids.astype(np.int64)), pixel_values=pixels)
    return {"image_embeds": rel_err(clip.encode_image(images), out.image_embeds.numpy()),
            "text_embeds": rel_err(clip.encode_text(ids), out.text_embeds.numpy()),
            "logits_per_image": rel_err(clip(images, ids), out.logits_per_image.numpy())}



def comparisons(full: bool) -> dict:
    "key -> (name as BENCHMARKS.md prints it, measure(tmp_dir) -> {quantity: error, maybe greedy_ours/greedy_theirs})."
    runs = {"bart-small": ("BART, small (d 64, 2+2 layers, 4 heads)", lambda t: measure_bart(SMALL_BART, t)),
            "bart-deep": ("BART, Mega's depth (d 32, 24+24 layers, 2 heads)", lambda t: measure_bart(DEEP_BART, t, prefix_len=16, greedy_steps=8)),
            "vqgan": ("VQGAN decoder, full width, 4×4 codes (eps 1e-5)", measure_vqgan),
            "clip-small": ("CLIP, small (width 64, 2+2 layers)", measure_clip)}
    if full:
        runs |= {"bart-mini": ("BART, Mini's widths (d 1024, 16 heads, GLU 2730, 2+2 layers)",
                               lambda t: measure_bart(MINI_WIDTH_BART, t, prefix_len=16, greedy_steps=8)),
                 "bart-mega": ("BART, Mega's widths (d 2048, 32 heads, GLU 4096, vocabularies 50272/16415, 2+2 layers)",
                               lambda t: measure_bart(MEGA_WIDTH_BART, t, prefix_len=8, greedy_steps=4)),
                 "vqgan-full": ("VQGAN, whole VQGanDetokenizer.forward, 256 codes → 256×256", measure_vqgan_full),
                 "clip-b32": ("CLIP ViT-B/32 sizes", lambda t: measure_clip(t, real_size=True))}
    return runs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also the real-size (slow) comparisons")
    ap.add_argument("--only", default="", help="run only the comparison with this key (bart-small, bart-deep, vqgan, clip-small; "
                    "with --full also bart-mini, bart-mega, vqgan-full, clip-b32) or whose name contains this")
    ap.add_argument("--out", default=None, help="also write peer_errors.json here")
    a = ap.parse_args(argv)
    runs = {k: v for k, v in comparisons(a.full).items() if not a.only or a.only == k or a.only in v[0]}
    if not runs: ap.error(f"--only {a.only!r} selects no comparison{'' if a.full else ' (without --full)'}")
    _torch()
    result = {"date": str(datetime.date.today()),
              "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}".strip(),
              "comparisons": {}}
    print(f"date {result['date']}  machine {result['machine']}")
    print("| comparison | quantity | max relative error |\n|---|---|---|")
    for key, (name, f) in runs.items():
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d: m = f(Path(d))
        greedy = m.pop("greedy_ours", None), m.pop("greedy_theirs", None)
        for k, v in m.items(): print(f"| {name} | {k} | {v:.1e} |")
        if greedy[0] is not None:
            print(f"| {name} | greedy ids, {len(greedy[0])} steps | {'identical' if greedy[0] == greedy[1] else 'DIFFER'} |")
        seconds = time.perf_counter() - t0
        print(f"<!-- {name}: {seconds:.0f}s -->", file=sys.stderr)
        result["comparisons"][key] = {"name": name, "errors": m, "greedy_ours": greedy[0], "greedy_theirs": greedy[1],
                                      "seconds": round(seconds, 1)}
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "peer_errors.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
