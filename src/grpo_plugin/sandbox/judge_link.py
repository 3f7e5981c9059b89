"""The judge's connection to its program's process (judge process; standard library only: it runs inside the
jail): requests (`get`, `call`, `attr`, `op`, ...) and their replies, one at a time (a request goes out when the one
before it has been answered), callbacks into what a test passed the program, the arguments a call changed in place.
Every byte from the program's process is untrusted: a reply is decoded by codec.Decoder under the job's byte
budget, into values and stand-ins (judge_stand_ins.py)."""

from __future__ import annotations

import collections
import json

try:
    from . import codec, wire
    from .judge_stand_ins import Kept, ProgramFailed, RemoteMeta, StandIns, describe_exception
except ImportError:  # in the jail: top-level modules beside forkserver.py
    import codec
    import wire
    from judge_stand_ins import Kept, ProgramFailed, RemoteMeta, StandIns, describe_exception


class Program:
    """The program's process, as the judge asks it."""


    def __init__(self, fd: int, value_bytes: int, job_bytes: int):
        self.fd, self.value_bytes = fd, value_bytes
        self.channel = wire.Channel(fd)
        self.stand_ins = StandIns(self)
        self.decoder = codec.Decoder(self.stand_ins.remote, self.stand_ins.klass, job_bytes, self.kept_here)
        self.decoder.function = self.stand_ins.function
        self.encoder = codec.Encoder(self.handle_of, self.describe_for_program, self.keep_here)
        self.callbacks: list = []  # what a test passed into the program that runs here (a lambda, an iterator)
        self.directory: dict[str, object] = {}  # the program's functions and classes as it ran (sent with ready)
        self.stashed: dict[str, tuple] = {}  # in place, the reply to `get` of a name that was not plain
        self.first_word = None  # the program's process's first message (first)
        self.deferred: dict[str, object] = {}  # the same, still as sent: not plain (decoded when first asked)
        self.asked = False  # a request other than `get` went out: the program may have rebound its names
        # in place, the reply to a call that was not plain: [handle, number of arguments, keyword names, reply],
        # taken by the same call out of place
        self.stashed_call: list | None = None

    # -- requests
    def request(self, *req):
        return self.answered(*self.exchange(*req))

    def exchange(self, *req) -> tuple:
        """Send `req`, read its reply: (kind, payload)."""
        if req[0] != "get":
            self.asked = True
        self.send(req)
        return self.read()[:2]

    def send(self, req, text: str | None = None) -> None:
        """Request `req` (or one already encoded as JSON `text`)."""
        try:
            wire.send(self.fd, (text if text is not None else wire.dumps(req)).encode())
        except OSError as exc:
            raise ProgramFailed(f"the program's process is gone ({exc.strerror})") from None

    def read(self) -> tuple:
        """The next reply: (kind, payload). Callbacks the program makes meanwhile (it calls a function or iterator
        the test passed it) are run here first."""
        kind, payload = self.read_one()
        while kind == "cb":
            self.callback(payload)
            kind, payload = self.read_one()
        return kind, payload

    def callback(self, payload) -> None:
        """Run what the test passed into the program, as the program asks (`f(x)`, `next(it)`), and answer."""
        try:
            k, op, args, kwargs = payload
            target = self.kept_here(k, "f")
            args, kwargs = self.value(args), self.value(kwargs)
            if not isinstance(args, list) or not isinstance(kwargs, dict) or op not in ("call", "next"):
                raise ValueError("a malformed callback")
            answer = ["cbret", "ok", self.encoder.tree(target(*args, **kwargs) if op == "call" else next(target))]
        except StopIteration:
            answer = ["cbret", "stop", None]
        except (ProgramFailed, RecursionError):
            raise
        except Exception as exc:  # noqa: BLE001 - the test's function raised: raised in the program, as there
            answer = ["cbret", "err", [type(exc).__name__, describe_exception(exc)]]
        self.send(answer)

    def keep_here(self, obj):
        """The encoder's hook: a callable or iterator of the test's (not the program's) stays here; the program
        gets a reference it calls back through."""
        if isinstance(obj, (Kept, RemoteMeta)):
            return None
        iterator = hasattr(type(obj), "__next__")
        if not (iterator or callable(obj)):
            return None
        self.callbacks.append(obj)
        return ["J", len(self.callbacks) - 1, "i" if iterator else "f"]

    def kept_here(self, k, kind):
        if type(k) is not int or not 0 <= k < len(self.callbacks):
            raise ValueError("a callback that was never passed")
        return self.callbacks[k]

    def read_one(self) -> tuple:
        try:
            data = self.channel.recv(self.value_bytes)
        except ValueError as exc:
            raise ProgramFailed(f"a value larger than the sandbox's limit ({exc})") from None
        except OSError as exc:
            raise ProgramFailed(f"the program's process is gone ({exc.strerror})") from None
        if data is None:
            raise ProgramFailed("the program's process ended")
        self.decoder.charge(len(data))
        try:
            kind, payload = json.loads(data.decode())
        except (ValueError, TypeError) as exc:
            raise ProgramFailed(f"an unreadable reply ({type(exc).__name__})") from None
        return kind, payload

    def first(self):
        """The program's process's first word: None (ready), or why the program did not run to its end. (In place,
        NotPlain when the program raised: asked again out of place, it answers from the word already read.)"""
        if self.first_word is None:
            data = self.channel.recv(self.value_bytes)
            if data is None:
                return "the program ended its process"
            self.decoder.charge(len(data))
            self.first_word = json.loads(data)
        kind, payload = self.first_word
        if kind == "ready":
            if not isinstance(payload, dict):
                return "an unexpected first reply"
            try:
                for k, v in payload.items():
                    try:
                        self.directory[k] = self.value(v)
                    except codec.NotPlain:
                        self.deferred[k] = v
            except ValueError as exc:
                return f"an unreadable first reply ({exc})"
            return None
        if kind == "exit":
            return f"the program exited with status {str(payload)[:80]}"
        if kind == "err":
            if self.decoder.plain_only:
                raise codec.NotPlain("an exception")
            exc = self.stand_ins.exception(payload)
            return f"the program raised {type(exc).__name__}"
        return "an unexpected first reply"

    def value(self, tree):
        return self.decoder.value(tree)

    def out_of_place(self) -> None:
        """From here on every value is built (judge.Judge.out_of_place): the first reply's values left as sent
        are decoded now, in the order sent (a class is described in full only where it is first met)."""
        self.decoder.plain_only = False
        for name, tree in list(self.deferred.items()):
            try:
                self.directory[name] = self.value(tree)
                del self.deferred[name]
            except ValueError:  # (said by the tests that ask for it)
                pass

    def get(self, name: str):
        if not self.asked:
            if name in self.deferred:
                self.directory[name] = self.value(self.deferred[name])
                del self.deferred[name]
            if name in self.directory:
                return self.directory[name]
        got = self.stashed.pop(name, None) or self.exchange("get", name)
        try:
            return self.value(self.answered(*got))
        except codec.NotPlain:  # read, not taken: out of place, the same question takes this answer
            self.stashed[name] = got
            raise

    def answered(self, kind: str, payload):
        """A reply's payload, or the exception the program raised, raised here (in place: NotPlain)."""
        if kind == "err":
            if self.decoder.plain_only:
                raise codec.NotPlain("an exception")
            raise self.stand_ins.exception(payload)
        if kind != "ok":
            raise ProgramFailed(f"an unexpected reply {kind!r}")
        return payload

    def call(self, handle: int, args: tuple, kwargs: dict):
        if self.stashed_call is not None:
            h, n, keys, (kind, tree) = self.stashed_call
            self.stashed_call = None
            if h != handle or n != len(args) or keys != tuple(kwargs):
                raise ProgramFailed("a call other than the one answered in place")
        else:
            kind, tree = self.exchange("call", handle, self.encoder.tree(list(args)), self.encoder.tree(dict(kwargs)))
        try:
            self.answered(kind, tree)
            self.decoder.function = None  # (in place) a call's value is data: a function it returns is an object
            try:  # of the program's, taken out of place
                ret, after = self.value(tree)
            finally:
                self.decoder.function = self.stand_ins.function
        except codec.NotPlain:  # the reply stays: the job's forked process takes it from here
            self.stashed_call = [handle, len(args), tuple(kwargs), (kind, tree)]
            raise
        if not isinstance(after, list) or len(after) != len(args):
            raise ProgramFailed("an unreadable reply (arguments)")
        for orig, new in zip(args, after):  # in-place changes to the arguments, as the program made them
            _sync(orig, new)
            if ret is new and _mutable(orig):
                ret = orig
        return ret

    # -- the codec's hooks
    def handle_of(self, obj) -> int:
        h = getattr(type(obj), "_grpo_handle_of", None)
        if h is None:
            raise TypeError(f"a {type(obj).__name__} of the test cannot be passed to the program's code")
        return h(obj)

    def describe_for_program(self, cls) -> dict:
        fields = getattr(cls, "_fields", None)
        return {"h": getattr(cls, "_grpo_class_handle", None), "n": cls.__name__,
                "nt": list(fields) if isinstance(fields, tuple) else None}


def _mutable(x) -> bool:
    return isinstance(x, (list, dict, set, bytearray, collections.deque))


def _sync(orig, new, depth: int = 0) -> None:
    """Make `orig` (the test's argument) hold what the program left in its copy, in place all the way down: a
    list or dict inside it that the program changed in place is changed in place here too (the test may hold it
    under another name), one it replaced is replaced."""
    if orig is new or not _mutable(orig) or type(new) is not type(orig) and not (
            isinstance(orig, dict) and isinstance(new, dict)):
        return
    if isinstance(orig, list) and len(orig) == len(new) and depth < codec.MAX_DEPTH:
        for k, (o, n) in enumerate(zip(orig, new)):
            if _mutable(o) and type(o) is type(n):
                _sync(o, n, depth + 1)
            else:
                orig[k] = n
    elif isinstance(orig, (list, bytearray)):
        orig[:] = new
    elif isinstance(orig, collections.deque):
        orig.clear()
        orig.extend(new)
    elif isinstance(orig, dict) and depth < codec.MAX_DEPTH:
        for key in [key for key in orig if key not in new]:
            del orig[key]
        for key, n in new.items():
            o = orig.get(key)
            if _mutable(o) and type(o) is type(n) and key in orig:
                _sync(o, n, depth + 1)
            else:
                orig[key] = n
    else:  # set
        orig.clear()
        orig.update(new)
