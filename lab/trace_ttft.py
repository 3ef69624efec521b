"""Time stamps along a served request's path, for one diagnosis run (never committed as code).

    python3 lab/trace_ttft.py apply     # edits the tree: each point writes "TR <time> <name>"
    python3 lab/trace_ttft.py report LOG [CLIENT_LOG]   # per request: ms between the points
    git checkout hotspec/               # undo

Points: A route entry, A3 tokenized, B sent to the engine process, C the engine's reader got it,
D added to the engine, E step starts, P0/P1 prefill starts/returns, F0 first token out of the
step, F posted to the pipe, G the server's reader got it, H delivered on the event loop, I the
SSE chunk yielded. lab/served_ttft.py's client prints "TC <time> send|first".
"""

from __future__ import annotations

import sys
from pathlib import Path

T = 'import sys as _s, time as _t; _s.stderr.write(f"TR {_t.time():.6f} %s\\n"); _s.stderr.flush()'
EP, RC, EL = "hotspec/entrypoints/engine_process.py", "hotspec/entrypoints/routes_chat.py", \
    "hotspec/entrypoints/engine_loop.py"
POINTS = [  # (file, anchor line (stripped), name, before/after)
    (RC, "body = await parse_request(request, s.settings, ChatCompletionRequest)", "A_route",
     "before"),
    (RC, "tools = body.parses_tool_calls", "A3_tokenized", "before"),
    (EP, 'self._send(("submit", cid, list(prompt_token_ids), params))', "B_send", "before"),
    (EP, 'h = self.handles[msg[1]] = RemoteHandle(msg[1])', "C_child_recv", "before"),
    (EP, 'results.send(("out", items, loop.step_errors, loop.consecutive_step_errors))', "F_post",
     "before"),
    (EP, "_, items, self.step_errors, self.consecutive_step_errors = msg", "G_parent_recv",
     "before"),
    (EL, "deliveries.append((cmd.handle, self._add(cmd)))", "D_added", "after"),
    (EL, "outputs = engine.step()", "E_step", "before_try"),
    (EL, 'self._observe("on_first_token", req, now - arrived)', "F0_first", "after"),
    ("hotspec/engine/engine.py", "tokens = self.worker.prefill(batch, chunks, meanwhile=", "P0_prefill",
     "before"),
    ("hotspec/engine/engine.py", "for r in batch:\n            self.prefixes.register(r)", "P1_prefilled",
     "before"),
    ("hotspec/entrypoints/request_handle.py", "fut = handle.accepted", "H_deliver", "before"),
    ("hotspec/entrypoints/responses.py", "out = \"\".join(map(fmt.sse, chunks.step(batch, index)))",
     "I_yield", "after"),
]


def apply() -> None:
    for path, anchor, name, where in POINTS:
        p = Path(path)
        s = p.read_text()
        first = anchor.split("\n")[0]
        i = s.find(first)
        assert i >= 0, (path, anchor)
        line_start = s.rfind("\n", 0, i) + 1
        indent = s[line_start:i]
        stamp = indent + T % name + "\n"
        if where == "after":
            end = s.find("\n", i + len(anchor)) + 1
            s = s[:end] + stamp + s[end:]
        elif where == "before_try":  # the anchor is inside a try: stamp before the try line
            try_at = s.rfind("try:", 0, i)
            ls = s.rfind("\n", 0, try_at) + 1
            s = s[:ls] + s[ls:try_at] + T % name + "\n" + s[ls:]
        else:
            s = s[:line_start] + stamp + s[line_start:]
        p.write_text(s)


def report(paths: list[str]) -> None:
    rows = []
    for path in paths:
        for line in Path(path).read_text(errors="replace").splitlines():
            if line.startswith(("TR ", "TC ")):
                _, t, name = line.split()[:3]
                rows.append((float(t), name))
    rows.sort()
    out, prev = [], None
    for t, name in rows:
        if name in ("send", "A_route") and out and out[-1][1] in ("first",):
            print("  ".join(f"{n} +{d:.2f}" for d, n in out[1:]))
            out = []
        out.append((0.0 if prev is None else (t - prev) * 1e3, name))
        prev = t
    print("  ".join(f"{n} +{d:.2f}" for d, n in out[1:]))


if __name__ == "__main__":
    apply() if sys.argv[1] == "apply" else report(sys.argv[2:])
