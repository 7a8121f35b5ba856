"""Peer equivalence: our converted models against implementations nobody here wrote, with random weights.

min-dalle 0.4.11's PyTorch `DalleBartEncoder`, `DalleBartDecoder` and `VQGanDetokenizer`, and transformers'
PyTorch `CLIPModel`, are built with random weights; their state dicts are saved to files, converted with
`dalle_nb.convert`, and the outputs compared: encoder states, decoder logits for a token prefix, super-conditioned
logits, greedy tokens, decoded images, CLIP embeddings and logits. Relative error = max |ours − theirs| / max |theirs|.

`measure_*` return the errors so `bench/peer_errors.py` can print the same figures for BENCHMARKS.md.
torch is imported inside the functions (it imports slowly on CPU).
"""
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import jax.numpy as jnp

from dalle_nb.config import BartConfig, VQGANConfig, F16_VQGAN
from dalle_nb.convert import (read_torch, bart_from_min_dalle, vqgan_from_min_dalle, build_model, load_clip,
                              clip_config_from_transformers)
from dalle_nb.bart import DalleBart, text_mask
from dalle_nb.vqgan import VQGAN
from dalle_nb.sample import supercondition, generate, row_keys

TOL = 1e-4
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
    return pytest.importorskip("torch", reason="peer tests need the dev extra (torch==2.13.0)")


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


# ---------------------------------------------------------------- the tests

def test_bart_matches_min_dalle(tmp_path):
    m = measure_bart(DEEP_BART, tmp_path, prefix_len=16, greedy_steps=8)
    print({k: v for k, v in m.items() if not k.startswith("greedy")})
    for k in ("encoder_states", "decoder_logits", "supercond_logits"): assert m[k] < TOL, (k, m[k])
    assert m["greedy_ours"] == m["greedy_theirs"]
    assert len(set(m["greedy_ours"])) > 1                     # a real sequence, not one id repeated


@pytest.mark.slow
@pytest.mark.parametrize("cfg, prefix_len, greedy_steps", [(MINI_WIDTH_BART, 16, 8), (MEGA_WIDTH_BART, 8, 4)], ids=["mini", "mega"])
def test_bart_matches_min_dalle_at_published_widths(tmp_path, cfg, prefix_len, greedy_steps):
    m = measure_bart(cfg, tmp_path, prefix_len=prefix_len, greedy_steps=greedy_steps)
    print({k: v for k, v in m.items() if not k.startswith("greedy")})
    for k in ("encoder_states", "decoder_logits", "supercond_logits"): assert m[k] < TOL, (k, m[k])
    assert m["greedy_ours"] == m["greedy_theirs"]


def test_vqgan_decoder_matches_min_dalle(tmp_path):
    m = measure_vqgan(tmp_path)
    print(m)
    assert m["decoder_output"] < TOL and m["image"] < TOL, m


@pytest.mark.slow
def test_vqgan_full_forward_matches_min_dalle(tmp_path):
    m = measure_vqgan_full(tmp_path)
    print(m)
    assert m["image_eps_1e-05"] < TOL, m


def test_clip_matches_transformers(tmp_path):
    m = measure_clip(tmp_path)
    print(m)
    assert max(m.values()) < TOL, m


@pytest.mark.slow
def test_clip_matches_transformers_vit_b32(tmp_path):
    m = measure_clip(tmp_path, real_size=True)
    print(m)
    assert max(m.values()) < TOL, m


def test_clip_config_matches_transformers_defaults():
    "transformers' default CLIPConfig is ViT-B/32: it converts to our preset (no weights needed)."
    _torch()
    from transformers import CLIPConfig as HFCLIPConfig
    from dalle_nb.config import CLIP_VIT_B32
    d = HFCLIPConfig(projection_dim=512).to_dict()
    assert clip_config_from_transformers(d) == replace(CLIP_VIT_B32, pad_id=clip_config_from_transformers(d).pad_id)


def test_generate_bench_runs(tmp_path):
    "bench/generate.py at its smallest: both sides (ours also int8) generate one image, min-dalle's loop draws our greedy tokens, the floor and the second process are reported."
    import subprocess, sys
    _torch()
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "bench" / "generate.py"), "--smoke", "--quantize", "none,int8", "--second-process", "--cache", str(tmp_path / "cache"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "generate.json").read_text())
    sides = res["widths"]["small"]
    assert set(sides) == {"ours", "ours (int8)", "min-dalle"} and all("error" not in s for s in sides.values()), sides
    assert all(s["rows"][0]["images"] == 1 and s["rows"][0]["warm_s"] > s["rows"][0]["decode_s"] > 0 and s["peak_rss_gb"] > 0
               for s in sides.values())
    assert res["agreement"]["agree"] == res["agreement"]["agree_unrolled"] == res["agreement"]["agree_served"] == 256, res["agreement"]
    assert [(f["quantize"], f["rows"]) for f in res["floor"]["floors"]] == [("none", 2), ("int8", 2)] and all(f["floor_ms"] > 0 for f in res["floor"]["floors"])
    assert all(sides[s]["cli"]["second_process_s"] > 0 for s in ("ours", "ours (int8)")), sides["ours"].get("cli")
    assert "| small | 1 | ours |" in (tmp_path / "out" / "generate.md").read_text()
