#!/usr/bin/env bash
# P/D split on a GPU: a prefill + decode engine pair with the KV moved over NCCL (two GPUs) or,
# on a one-GPU lease, over gloo staged through host memory (NCCL refuses two ranks on one
# device). Checks greedy output split == colocated and times a 4k-token handoff vs its
# recompute. At most ~5 minutes; writes $OUT/pd_cuda.json (or bench/results/pd_cuda.json).
#
#   PREFIXGATE_MODEL_DIR=/path/SmolLM2-135M-Instruct PY=.venv/bin/python bench/device/pd_cuda.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
MODEL=${PREFIXGATE_MODEL_DIR:-$HOME/.cache/prefixgate/models/SmolLM2-135M-Instruct}
OUTDIR=${OUT:-bench/results}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NGPU" -ge 2 ]; then PDEV=cuda:0; DDEV=cuda:1; BACKEND=nccl; else PDEV=cuda:0; DDEV=cuda:0; BACKEND=gloo; fi
LINK=tcp://127.0.0.1:29731
COMMON=(--model "$MODEL" --dtype bfloat16 --num-kv-slots 65536 --pd-link $LINK --pd-backend $BACKEND
        --pd-buffer-tokens 8192 --log-level warning --pd-timeout-s 60 --log-stats-interval 0)
timeout 280 $PY -m prefixgate.local_engine --role decode --port 18191 --device $DDEV "${COMMON[@]}" \
  > /tmp/pd_cuda_decode.log 2>&1 &
DEC=$!
timeout 280 $PY -m prefixgate.local_engine --role prefill --port 18190 --device $PDEV "${COMMON[@]}" \
  --pd-peer-url http://127.0.0.1:18191 > /tmp/pd_cuda_prefill.log 2>&1 &
PRE=$!
trap 'kill $PRE $DEC 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -sf localhost:18190/health >/dev/null && curl -sf localhost:18191/health >/dev/null && break
  sleep 1
done
timeout 200 $PY - "$OUTDIR" "$BACKEND" "$NGPU" <<'PY'
import asyncio, json, random, re, sys, time
import httpx
from prefixgate.config.pd_settings import PDSettings
from prefixgate.proxy.routing.pd.drive import PDDriver

out_dir, backend, ngpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
P, D = "http://127.0.0.1:18190/v1", "http://127.0.0.1:18191/v1"

def metric(text, name):
    m = re.search(rf"^{re.escape(name)} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0

async def main():
    async with httpx.AsyncClient(timeout=120) as c:
        async def send(url, headers, body, timeout_s):
            req = c.build_request("POST", url, content=body, headers={
                "content-type": "application/json", **{k: v.decode() for k, v in headers.items()}})
            return await c.send(req, stream=True)
        drv = PDDriver(send)
        pd = PDSettings(prefill=P, decode=D, split_min_uncached_tokens=0, colocate_min_cached_fraction=1.0)
        for _ in range(60):  # the link pairs in the background
            if "engine_kv_link_up 1.0" in (await c.get(P[:-3] + "/metrics")).text:
                break
            await asyncio.sleep(1)
        same = []
        for q in ["Name three colors of the rainbow.", "What is a radix tree?", "Say hello in French."]:
            body = {"model": "m", "messages": [{"role": "user", "content": q}], "max_tokens": 16, "temperature": 0}
            colo = (await c.post(P + "/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
            r, dec = await drv.drive(pd, "/chat/completions", body, {})
            await r.aread()
            same.append(dec.split and r.json()["choices"][0]["message"]["content"] == colo)
        rng = random.Random(7)
        runs = []
        for _ in range(3):
            ids = [rng.randrange(1000, 40000) for _ in range(4000)]
            pm0, dm0 = (await c.get(P[:-3] + "/metrics")).text, (await c.get(D[:-3] + "/metrics")).text
            t0 = time.perf_counter()
            r, _ = await drv.drive(pd, "/completions", {"model": "m", "prompt": ids, "max_tokens": 1,
                                                        "temperature": 0, "ignore_eos": True}, {})
            await r.aread()
            wall = (time.perf_counter() - t0) * 1000
            pm1, dm1 = (await c.get(P[:-3] + "/metrics")).text, (await c.get(D[:-3] + "/metrics")).text
            k = "engine_kv_transfer_seconds_total"
            other = [rng.randrange(1000, 40000) for _ in range(4000)]
            rc = await c.post(D + "/completions", json={"model": "m", "prompt": other, "max_tokens": 1,
                                                        "temperature": 0, "ignore_eos": True})
            runs.append({"handoff_ms": round((metric(pm1, k) - metric(pm0, k) + metric(dm1, k) - metric(dm0, k)) * 1000, 2),
                         "split_wall_ms": round(wall, 1),
                         "recompute_ms": float(rc.headers.get("x-engine-prefill-ms", "nan"))})
        res = {"command": "bench/device/pd_cuda.sh", "backend": backend, "gpus": ngpu,
               "figures": {"greedy_identical": all(same),
                           "handoff_ms_4k": sorted(r["handoff_ms"] for r in runs)[1],
                           "recompute_ms_4k": sorted(r["recompute_ms"] for r in runs)[1]},
               "runs": runs, "greedy_runs": same}
        print(json.dumps(res, indent=2))
        open(f"{out_dir}/pd_cuda.json", "w").write(json.dumps(res, indent=2) + "\n")

asyncio.run(main())
PY
