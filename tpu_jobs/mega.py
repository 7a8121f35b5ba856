"""DALL·E Mega's BART on a TPU v3-256, through `dalle_nb.pod` (the API `dalle-nb pod …` and nbs/16_pod.ipynb use) and `dalle_nb.fitcheck`.

Dry run (the default) — prints every command it would run:

    python tpu_jobs/mega.py --bucket my-bucket --tokens gs://my-bucket/tokens/laion

For real (needs gcloud, a project with v3 quota, a GCS bucket):

    python tpu_jobs/mega.py --bucket my-bucket --tokens gs://my-bucket/tokens/laion --go

Steps: the fit check (when libtpu is installed here: the step must fit 16 GiB per core, else nothing is created), build
a wheel of this checkout, create the spot pod, install the wheel and mount the bucket on all 32 workers, launch
`dalle-nb train --stages bart --data …` on every worker, then watch: after a preemption the pod is recreated and the
run resumes from its last checkpoint in gs://BUCKET/runs/RUN (at most --max-restarts times).

Before the first launch, put a model directory with the tokenizer, VQGAN and CLIP the shards were encoded with at
gs://BUCKET/runs/RUN/model (e.g. `dalle-nb convert …` of the published Mega, then `gcloud storage cp -r`): the BART
stage trains a new BART and keeps the other models.
"""
import argparse, sys
from dalle_nb.pod import PodSpec, TrainJob, TPUPod, DryRun, Shell, build_wheel, watch, PodError
from dalle_nb.fitcheck import libtpu_available, fit_check, FitError

# The journal's batch: 44 samples per model replica x 32 replicas x 3 accumulation steps = 4224 per update.
# (`bart_train.batch_size` is the global batch of one update for `dalle-nb train`.)
SETS = ("bart_train.batch_size=4224", "bart_train.grad_accum=3")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="dalle-mega", help="pod name")
    ap.add_argument("--run", default="mega-1", help="run name")
    ap.add_argument("--zone", default="europe-west4-a")
    ap.add_argument("--project", default=None)
    ap.add_argument("--bucket", required=True, help="GCS bucket for the work directory (checkpoints, logs, model)")
    ap.add_argument("--tokens", action="append", required=True, help="token shards (dalle-nb encode), gs://… (repeatable)")
    # What fits (BENCHMARKS.md, "Fit on a TPU v3-256"): the journal's Shampoo on dp=32,mp=8 needs 7.6 GiB/core, Adam 13.0.
    ap.add_argument("--optimizer", default="shampoo", choices=("adam", "adafactor", "shampoo"))
    ap.add_argument("--mesh", default="dp=32,mp=8")
    ap.add_argument("--provisioning", default="spot", choices=("spot", "preemptible", "standard"))
    ap.add_argument("--max-restarts", type=int, default=20)
    ap.add_argument("--go", action="store_true", help="really run the commands (default: print them)")
    ap.add_argument("--skip-fit-check", action="store_true")
    a = ap.parse_args()

    spec = PodSpec(a.name, zone=a.zone, project=a.project, provisioning=a.provisioning)
    job = TrainJob(a.run, f"gs://{a.bucket}/runs/{a.run}", preset="mega", stages=("bart",), data=tuple(a.tokens),
                   mesh=a.mesh, optimizer=a.optimizer, sets=SETS)
    if not a.skip_fit_check and libtpu_available():
        from dalle_nb.config import get_config
        rep = fit_check(get_config("mega", [f"bart_train.optimizer={a.optimizer}"]), "v3:8x16", a.mesh, per_replica=44, accum=3)
        print(rep.table())
        if not rep.fits: sys.exit("mega.py: the step does not fit a v3 core; not creating anything")
    elif not a.skip_fit_check:
        print("mega.py: libtpu not installed here (pip install -e '.[tpu]'): fit check skipped")
    runner = Shell() if a.go else DryRun()
    pod = TPUPod(spec, runner)
    wheel = build_wheel("dist", runner=runner)
    pod.create()
    pod.setup(wheel, mounts=job.buckets)
    pod.launch(job)
    print(f"watch: {watch(pod, job, wheel, max_restarts=a.max_restarts)}")


if __name__ == "__main__":
    try: main()
    except (PodError, FitError) as e: sys.exit(f"mega.py: {e}")
