#!/usr/bin/env python3
"""Times sluice-cni's ADD when the agent cannot be reached (the plugin asks
the Kubernetes API itself), whole process, for both answers:

  * a pod not in the mesh: two GETs, passed through (exit 0);
  * a pod in the mesh: two GETs, code 11 (exit 1);
  * and, for scale, a pod of an excluded namespace (no request at all).

Against the test API server (test/apiserver/apiserver.py, TLS + token on
127.0.0.1), with a kubeconfig written by `sluice-cni install --kubeconfig`
from its token and CA. Each run is one fork+exec of the static binary with
the network config on stdin, as a runtime runs it; the pod netns is this
process's own (ADD only reads it). Prints the median, p10 and p90 of N runs.

Usage (root not needed): test/scripts/cni_add_without_agent.py BUILD_DIR [N]
"""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "apiserver", "apiserver.py")


def admin(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/apply", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as r:
        return json.load(r)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    plugin = os.path.join(build, "sluice-cni")
    work = tempfile.mkdtemp(prefix="sluice-cni-time-")
    server = None
    try:
        sdir = os.path.join(work, "api")
        server = subprocess.Popen([sys.executable, SERVER, "--dir", sdir], stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(work, "server.log"), "w"))
        ready = os.path.join(sdir, "ready.json")
        deadline = time.time() + 20
        while not os.path.exists(ready):
            if time.time() > deadline or server.poll() is not None:
                sys.exit("the test API server did not start: " + open(os.path.join(work, "server.log")).read())
            time.sleep(0.05)
        ports = json.load(open(ready))
        ops = [{"op": "create", "kind": "namespaces", "object": {"metadata": {"name": n, "labels": l}}}
               for n, l in (("shop", {}), ("mesh", {"istio.io/dataplane-mode": "ambient"}), ("kube-system", {}))]
        for ns, name in (("shop", "web"), ("mesh", "app"), ("kube-system", "dns")):
            ops.append({"op": "create", "kind": "pods", "object": {
                "metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}]}}})
        admin(ports["admin_port"], {"ops": ops})
        # sluice-cni install writes the kubeconfig (into a scratch chain).
        for d in ("net.d", "bin"):
            os.makedirs(os.path.join(work, d))
        with open(os.path.join(work, "net.d", "10-x.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "bridge"}]}, f)
        kubeconfig = os.path.join(work, "cni-kubeconfig")
        env = dict(os.environ, KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(ports["api_port"]))
        subprocess.run([plugin, "install", "--cni-conf-dir", os.path.join(work, "net.d"), "--cni-bin-dir",
                        os.path.join(work, "bin"), "--agent-socket", os.path.join(work, "no-agent.sock"),
                        "--kubeconfig", kubeconfig, "--service-account-dir", sdir], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/proc/self/ns/net"}],
                "ips": [{"interface": 0, "address": "10.1.0.5/24"}]}
        conf = json.dumps({"cniVersion": "1.0.0", "name": "x", "type": "sluice-cni",
                           "agentSocket": os.path.join(work, "no-agent.sock"), "kubeconfig": kubeconfig,
                           "prevResult": prev}).encode()
        print(f"sluice-cni ADD without the agent, {runs} runs each, whole process (fork+exec to exit):")
        for ns, name, want in (("shop", "web", 0), ("mesh", "app", 1), ("kube-system", "dns", 0)):
            cenv = {"PATH": "/usr/bin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "timing-" + name,
                    "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "eth0",
                    "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"}
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                r = subprocess.run([plugin], input=conf, env=cenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                times.append((time.perf_counter() - t) * 1000)
                if r.returncode != want:
                    sys.exit(f"{ns}/{name}: exit {r.returncode}, expected {want}: {r.stdout.decode()} {r.stderr.decode()}")
            q = statistics.quantiles(times, n=10)
            what = {"shop": "not in the mesh -> passed (exit 0)", "mesh": "in the mesh -> code 11",
                    "kube-system": "excluded namespace -> passed, no request"}[ns]
            print(f"  {what:45s} median {statistics.median(times):6.1f} ms  p10 {q[0]:6.1f}  p90 {q[-1]:6.1f}")
    finally:
        if server:
            server.send_signal(signal.SIGTERM)
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
