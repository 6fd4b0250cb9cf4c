"""`make dashboard-check`: the job as its users watch it, checked with the real tools.

    python -m cluster.dashboard_check [--out runs/dashboard-check] [--iterations 8]

1. Starts a local Ray with its dashboard and submits a short embedded job to it as users do (`ray job
   submit`'s API, with a submission id naming the run and the run directory in the metadata; two explorers
   and a reward scorer, so every kind of actor and every series is there).
2. Starts Debian's `prometheus` on loopback, scraping Ray through the service-discovery file Ray writes
   (`<temp dir>/prom_metrics_service_discovery.json`, as Ray's own Prometheus setup does), and evaluates
   every query of the Grafana dashboard (`cluster.monitoring.grafana`) against it: each must return a series.
3. Opens the Ray dashboard's Jobs and Actors pages in headless Chromium (Debian's `chromium`), driven
   over the DevTools protocol so it can carry the cluster's authentication token as the dashboard's
   login would (Ray 2.60 turns token authentication on by default), checks that the pages name the job
   and the actors `solrl-learner-0`, `solrl-explorer-0/1`, `solrl-scorer-0`, and saves screenshots.

Grafana itself has no Debian package and cannot be installed here; the queries it would run are the
ones checked in step 2. Writes `<out>/jobs.png`, `<out>/actors.png`, `<out>/dashboard_check.json`, the
job's log `<out>/job.log` and its run directory `<out>/embedded`;
exits 1 if a query returns nothing or a page lacks what it must show.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.identity import job_name, run_label
from cluster.config.loading import load_config
from cluster.monitoring.grafana import PANELS, install_dashboard, metric_names, promql
from cluster.runtime.local_ray import LocalRay

if TYPE_CHECKING:
    from ray.job_submission import JobStatus, JobSubmissionClient

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/embedded.yaml"
TOOLS = {"prometheus": "prometheus", "chromium": "chromium"}  # binary → Debian package
SCRAPE_S = 2
BROWSER_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--remote-allow-origins=*", "--window-size=1600,1000"]
TOKEN_COOKIE = "ray-authentication-token"  # ray._private.authentication.authentication_constants


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_tools() -> list[str]:
    return [package for binary, package in TOOLS.items() if shutil.which(binary) is None]


def check_sets(iterations: int) -> list[str]:
    """The short job's overrides of the embedded preset: every kind of actor, an evaluation every 2."""
    return [f"run.iterations={iterations}", "run.checkpoint_every=0", "eval.every=2", "eval.prompts=4",
            "eval.seeds_per_prompt=4", "prompts.per_iteration=4", "prompts.candidates=48", "prompts.keep=12",
            "cluster.explorers.count=2", "cluster.explorers.num_cpus=0.5", "cluster.explorers.threads=1",
            "cluster.learner.num_cpus=0.5", "cluster.learner.threads=1", "cluster.scorers.count=1",
            "cluster.scorers.num_cpus=0.25"]


# ---- Prometheus ----------------------------------------------------------------------------------
def start_prometheus(folder: Path, discovery: Path, port: int) -> subprocess.Popen:
    config = folder / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}\n"
        "scrape_configs:\n- job_name: ray\n  file_sd_configs:\n"
        f"  - files: ['{discovery}']\n    refresh_interval: {SCRAPE_S}s\n")
    log = open(folder / "prometheus.log", "w")  # noqa: SIM115 (lives as long as the process)
    return subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)


def query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = json.loads(urllib.request.urlopen(url, timeout=10).read())
    if answer.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {answer}")
    return answer["data"]["result"]


def evaluate_panels(port: int) -> list[dict[str, Any]]:
    """Every dashboard query, as Grafana would send it (its variables replaced): series returned."""
    rows = []
    for panel in PANELS:
        for q in panel.queries:
            expr = promql(q.expr, window=f"{10 * SCRAPE_S}s", range_="10m")
            result = query(port, expr)
            values = [float(r["value"][1]) for r in result]
            rows.append({"panel": panel.title, "query": expr, "metrics": sorted(metric_names(expr)),
                         "series": len(result), "values": values[:4]})
    return rows


# ---- Chromium over the DevTools protocol ---------------------------------------------------------
async def browse(debug_port: int, pages: list[tuple[str, Path]], cookie: tuple[str, str] | None,
                 settle_s: float) -> dict[str, str]:
    """Open each page, wait for it to settle, save a screenshot; the text each page shows."""
    import aiohttp

    texts = {}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{debug_port}/json/list") as r:
            target = next(t for t in await r.json() if t["type"] == "page")
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            calls = 0

            async def call(method: str, **params: Any) -> dict[str, Any]:
                nonlocal calls
                calls += 1
                await ws.send_json({"id": calls, "method": method, "params": params})
                async for message in ws:
                    data = message.json()
                    if data.get("id") == calls:
                        if "error" in data:
                            raise RuntimeError(f"{method}: {data['error']}")
                        return data.get("result", {})
                raise RuntimeError(f"{method}: the browser closed the connection")

            await call("Network.enable")
            if cookie is not None:  # what the dashboard's login dialog stores (an HttpOnly cookie)
                await call("Network.setCookie", name=TOKEN_COOKIE, value=cookie[1], url=cookie[0], httpOnly=True)
            await call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1,
                       mobile=False)
            for url, path in pages:
                await call("Page.navigate", url=url)
                await asyncio.sleep(settle_s)
                shot = await call("Page.captureScreenshot", format="png")
                path.write_bytes(base64.b64decode(shot["data"]))
                text = await call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)
                texts[url] = text["result"].get("value", "")
    return texts


def auth_token() -> str | None:
    """The token Ray's token authentication checks (None when it is off): RAY_AUTH_TOKEN, the file at
    RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token, as Ray looks for it."""
    if os.environ.get("RAY_AUTH_MODE", "token") == "disabled":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return path.read_text().strip() if path.is_file() else None


# ---- the check -----------------------------------------------------------------------------------
def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(1)


@dataclass(frozen=True)
class _Plan:
    """What the check submits and where it writes, settled before Ray starts."""
    out: Path
    run_dir: Path
    name: str
    submission_id: str
    entrypoint: str
    settle_s: float


@dataclass(frozen=True)
class _Seen:
    """What the running job showed: the dashboard queries' rows, the pages' texts, the job's end."""
    rows: list[dict[str, Any]]
    pages: list[tuple[str, Path]]
    texts: dict[str, str]
    status: JobStatus


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    missing = missing_tools()
    if missing:
        print(f"error: {', '.join(missing)} not found; install Debian's packages: apt-get install -y "
              f"{' '.join(missing)}", file=sys.stderr)
        return 2
    plan = _plan(args)
    seen = _run_job(plan)
    return _report(plan, seen, _checks(plan, seen))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cluster.dashboard_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/dashboard-check"),
                        help="where the report, the screenshots and the job's log go")
    parser.add_argument("--iterations", type=int, default=24,
                        help="long enough that the actors are still alive when the pages are captured")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds a page gets to load its data")
    return parser.parse_args(argv)


def _plan(args: argparse.Namespace) -> _Plan:
    """Validate the job's overrides (a bad one fails before Ray starts), empty `--out`, name the job."""
    sets = check_sets(args.iterations)
    load_config(CONFIG, sets)  # a bad override fails here, before Ray starts
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_dir = out / "embedded"
    # as docs/monitoring.md advises: the submission id and the job's name (the dashboard's Name column) say
    # which run it is, the metadata holds its directory
    name = job_name(run_label(str(run_dir), ""))  # as a local launch names its driver job
    submission_id = f"{name}-{secrets.token_hex(3)}"
    entrypoint = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "cluster.launch", "--config", CONFIG,
                                                   "--run-dir", str(run_dir), *(x for v in sets for x in ("--set", v))])
    return _Plan(out=out, run_dir=run_dir, name=name, submission_id=submission_id, entrypoint=entrypoint,
                 settle_s=args.settle)


def _run_job(plan: _Plan) -> _Seen:
    """Start Ray with its dashboard, submit the job, start Prometheus and Chromium, watch; stop them all."""
    import ray
    from ray.job_submission import JobSubmissionClient

    dashboard_port, prometheus_port, debug_port = free_port(), free_port(), free_port()
    local = LocalRay.start(plan.run_dir, num_cpus=4, dashboard_host="127.0.0.1", dashboard_port=dashboard_port,
                           include_dashboard=True, log_to_driver=False)
    base = f"http://127.0.0.1:{dashboard_port}"
    scratch = Path(tempfile.mkdtemp(prefix="solrl-check-"))
    prometheus = browser = None
    try:
        install_dashboard(ray._private.worker.global_worker.node.get_session_dir_path())
        client = JobSubmissionClient(base)
        _submit(client, plan)
        discovery = local.folder / "prom_metrics_service_discovery.json"
        wait_for(discovery.is_file, 120, "Ray's Prometheus service discovery file")
        prometheus = start_prometheus(scratch, discovery, prometheus_port)
        browser = subprocess.Popen(["chromium", *BROWSER_FLAGS, f"--remote-debugging-port={debug_port}",
                                    f"--user-data-dir={scratch / 'browser'}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return _watch(client, plan, base, prometheus_port, debug_port)
    finally:
        for process in (browser, prometheus):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
        local.stop(remove=True)
        shutil.rmtree(scratch, ignore_errors=True)


def _submit(client: JobSubmissionClient, plan: _Plan) -> None:
    """As users submit: `ray job submit`'s API, the run's name and directory in the metadata."""
    client.submit_job(entrypoint=f"cd {shlex.quote(str(REPO))} && {plan.entrypoint}",
                      submission_id=plan.submission_id, metadata={"job_name": plan.name, "run_dir": str(plan.run_dir)},
                      runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}})
    print(f"submitted {plan.submission_id}: {plan.entrypoint}")


def _watch(client: JobSubmissionClient, plan: _Plan, base: str, prometheus_port: int, debug_port: int) -> _Seen:
    """Once Prometheus has three iterations, evaluate the queries and capture the pages while the actors
    are alive; then wait for the job's end and keep its log."""
    wait_for(lambda: _iterations_done(client, plan.submission_id, prometheus_port) >= 3, 900,
             "three iterations scraped by Prometheus")
    time.sleep(3 * SCRAPE_S)  # the rate() windows get their second point
    rows = evaluate_panels(prometheus_port)
    wait_for(lambda: _listening(debug_port), 60, "Chromium's DevTools port")
    token = auth_token()
    pages = [(f"{base}/#/jobs", plan.out / "jobs.png"), (f"{base}/#/actors", plan.out / "actors.png")]
    texts = asyncio.run(browse(debug_port, pages, (base, token) if token else None, plan.settle_s))
    wait_for(lambda: client.get_job_status(plan.submission_id).is_terminal(), 900, "the job's end")
    status = client.get_job_status(plan.submission_id)
    logs = client.get_job_logs(plan.submission_id)
    (plan.out / "job.log").write_text(logs)
    return _Seen(rows=rows, pages=pages, texts=texts, status=status)


def _iterations_done(client: JobSubmissionClient, submission_id: str, prometheus_port: int) -> float:
    """The iterations Prometheus has scraped (0 before it answers); a job that already ended raises."""
    if client.get_job_status(submission_id).is_terminal():
        raise RuntimeError(f"the job ended early:\n{client.get_job_logs(submission_id)[-4000:]}")
    try:
        return max((float(r["value"][1]) for r in query(prometheus_port, "ray_solrl_iterations_done")),
                   default=0.0)
    except OSError:
        return 0.0


def _checks(plan: _Plan, seen: _Seen) -> dict[str, bool]:
    """Each thing the dashboard, Prometheus and the run must show, and whether it did."""
    from ray.job_submission import JobStatus

    actors_text, jobs_text = seen.texts[seen.pages[1][0]], seen.texts[seen.pages[0][0]]
    summary_path = plan.run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    submission_id, name = plan.submission_id, plan.name
    return {"actors page names solrl-learner-0": "solrl-learner-0" in actors_text,
            "actors page names solrl-explorer-0 and -1": "solrl-explorer-0" in actors_text
            and "solrl-explorer-1" in actors_text,
            "actors page names solrl-scorer-0": "solrl-scorer-0" in actors_text,
            "actors page names the weight-sync service": "solrl-weight-sync-" in actors_text,
            "actors page shows them alive": "ALIVE" in actors_text,
            f"jobs page shows the submission id {submission_id}": submission_id in jobs_text,
            f"jobs page shows the job's name {name}": name in jobs_text.replace(submission_id, ""),
            "every dashboard query returns a series": all(r["series"] > 0 for r in seen.rows),
            "the job succeeded": seen.status == JobStatus.SUCCEEDED,
            "the run's summary names the job": summary.get("ray_job") == submission_id}


def _report(plan: _Plan, seen: _Seen, wanted: dict[str, bool]) -> int:
    """Print the queries and the checks, write dashboard_check.json; the exit code (1: a check failed)."""
    print(f"\n{'panel':<38} {'series':>6}  query")
    for r in seen.rows:
        print(f"{r['panel']:<38} {r['series']:>6}  {r['query']}")
    print()
    for what, ok in wanted.items():
        print(f"{'ok  ' if ok else 'FAIL'}  {what}")
    report = {"submission_id": plan.submission_id, "run_dir": str(plan.run_dir), "queries": seen.rows,
              "checks": wanted, "screenshots": [str(p) for _, p in seen.pages]}
    out = plan.out
    (out / "dashboard_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out / 'jobs.png'}, {out / 'actors.png'}, {out / 'dashboard_check.json'}, {out / 'job.log'}")
    return 0 if all(wanted.values()) else 1


def _listening(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=2).read()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
