"""Peer-equivalence errors of the converters: our converted models vs min-dalle 0.4.11 and transformers' CLIPModel.

Runs the measurements of tests/test_peers.py (random weights, CPU) and prints a markdown table of the maximum
relative errors (max |ours - theirs| / max |theirs|) for BENCHMARKS.md.

    python bench/peer_errors.py            # the small configurations the default test run uses
    python bench/peer_errors.py --full     # also DALL·E Mini's and Mega's widths, the full 256 px VQGAN decoder, CLIP ViT-B/32
"""
import argparse, datetime, platform, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_peers as P  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="also the real-size (slow) comparisons")
    ap.add_argument("--only", default="", help="run only the comparisons whose name contains this")
    a = ap.parse_args()
    runs = [("BART, small (d 64, 2+2 layers, 4 heads)", lambda t: P.measure_bart(P.SMALL_BART, t)),
            ("BART, Mega's depth (d 32, 24+24 layers, 2 heads)", lambda t: P.measure_bart(P.DEEP_BART, t, prefix_len=16, greedy_steps=8)),
            ("VQGAN decoder, full width, 4×4 codes (eps 1e-5)", lambda t: P.measure_vqgan(t)),
            ("CLIP, small (width 64, 2+2 layers)", lambda t: P.measure_clip(t))]
    if a.full:
        runs += [("BART, Mini's widths (d 1024, 16 heads, GLU 2730, 2+2 layers)",
                  lambda t: P.measure_bart(P.MINI_WIDTH_BART, t, prefix_len=16, greedy_steps=8)),
                 ("BART, Mega's widths (d 2048, 32 heads, GLU 4096, vocabularies 50272/16415, 2+2 layers)",
                  lambda t: P.measure_bart(P.MEGA_WIDTH_BART, t, prefix_len=8, greedy_steps=4)),
                 ("VQGAN, whole VQGanDetokenizer.forward, 256 codes → 256×256", lambda t: P.measure_vqgan_full(t)),
                 ("CLIP ViT-B/32 sizes", lambda t: P.measure_clip(t, real_size=True))]
    runs = [r for r in runs if a.only in r[0]]
    print(f"date {datetime.date.today()}  machine {platform.machine()} {platform.processor() or ''} python {platform.python_version()}")
    print("| comparison | quantity | max relative error |\n|---|---|---|")
    for name, f in runs:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d: m = f(Path(d))
        greedy = m.pop("greedy_ours", None), m.pop("greedy_theirs", None)
        for k, v in m.items(): print(f"| {name} | {k} | {v:.1e} |")
        if greedy[0] is not None:
            print(f"| {name} | greedy ids, {len(greedy[0])} steps | {'identical' if greedy[0] == greedy[1] else 'DIFFER'} |")
        print(f"<!-- {name}: {time.perf_counter() - t0:.0f}s -->", file=sys.stderr)


if __name__ == "__main__":
    main()
