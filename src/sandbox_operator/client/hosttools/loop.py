"""The host side of one host-tool run's channel: start the launcher, poll and answer each call
through the run's door, read the end, and stop the program when the run does not end by itself.

:mod:`.channel` holds the design (its docstring: layout, receipts, failure semantics, round
trips) and the run a caller starts (:func:`~.channel.run_with_host_tools`: setup, cleanup and
when the sandbox becomes unclean). This module is the loop that run drives, its own module
because it speaks the guest scripts' wire (:mod:`.guest`: ``START``, ``POLL``, ``STOP`` and
their answers) and keeps every exec within the run's deadline, apart from what a caller sees.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field

from sandbox_operator.client.errors import ExecTimeout, TransferCapExceeded
from sandbox_operator.client.hosttools.errors import (
    HostToolChannelError,
    HostToolDeliveryUncertain,
    HostToolRunTimeout,
    HostToolRunUnclean,
    SignalOutcome,
)
from sandbox_operator.client.hosttools.guest import POLL, START, STOP
from sandbox_operator.client.hosttools.layout import TRANSPORT_FILES, GuestRunLayout
from sandbox_operator.client.hosttools.registry import (
    HostToolAnswer,
    HostToolCallRecord,
    HostToolRun,
)
from sandbox_operator.client.sandbox import Sandbox

log = logging.getLogger(__name__)

#: Slack on top of a poll's own budget before its exec is abandoned as hung.
_EXEC_SLACK = 30.0
#: How long past the run's deadline an exec may take before the run is ended as overrun: an
#: exec that blocks (a guest file that never answers) cannot stretch the run beyond it.
_DEADLINE_GRACE = 5.0
#: The stop exec's bound: the launcher's sweep (up to 8 s) and the output read.
_STOP_TIMEOUT = 20.0


class _OversizedRequest(bytes):
    """Stands in for a request the sandbox refused to send because it is above the cap.

    It holds no bytes; its length is the size the sandbox reported, which is all the door's size
    gate reads before it refuses (the guest is then answered ``HostToolRequestTooLarge``, and the
    refusal counts toward the run's cap like any other)."""

    _size: int

    def __new__(cls, size: int) -> _OversizedRequest:
        made = super().__new__(cls, b"")
        made._size = size
        return made

    def __len__(self) -> int:
        return self._size


@dataclass(frozen=True)
class Finished:
    """A program that ran to its end, by its launcher's own word (the marker's receipt)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    leftovers_ended: int


@dataclass(frozen=True)
class _Marker:
    """The launcher's exit marker, ``<code> <ended> <receipt>``: authentic only when it carries
    the receipt this run gave the launcher (no guest process can read it), and complete only
    when ``ended`` is not -1 (the launcher emptied its tree)."""

    code: int
    ended: int

    @classmethod
    def parse(cls, text: str, receipt: str) -> _Marker | None:
        parts = text.split()
        if len(parts) != 3 or not secrets.compare_digest(parts[2], receipt):
            return None
        try:
            return cls(int(parts[0]), int(parts[1]))
        except ValueError:
            return None


@dataclass
class ChannelLoop:
    """One run's host-side loop: poll, answer through the door, stop the program on the way out."""

    sandbox: Sandbox
    run: HostToolRun
    layout: GuestRunLayout
    poll_interval: float
    long_poll: float
    started: bool = False
    finished: bool = False
    #: A run that failed (a cancellation, a broken exec) whose program's group could not be
    #: signalled, nor its launcher's marker say it ended: processes of the run may still run
    #: (``_after_failure``).
    left_running: bool = False
    signalled: bool = False
    output_cap: int = field(init=False)
    #: Given to the launcher on the start exec's stdin and written into its exit marker: what
    #: tells the launcher's marker from one the program wrote.
    receipt: str = field(default_factory=lambda: secrets.token_hex(16), init=False, repr=False)
    #: The launcher's pid and start time in clock ticks, read by the start exec before the
    #: program could run: who the polls and the stop ask about ("" until started).
    launcher: tuple[str, str] = ("", "")

    def __post_init__(self) -> None:
        self.output_cap = self.sandbox.spec.files_out.max_bytes_per_file

    async def start(self) -> None:
        transport = self.layout.transport_path
        self.started = True  # from here on the program may be running: a failure stops it
        res = await self.sandbox.exec(
            ["sh", "-c", START, "sbx-start", transport],
            cwd=transport,
            stdin=f"{self.receipt}\n".encode(),
            timeout=60.0,
        )
        if res.exit_code == 127:
            raise HostToolChannelError("the sandbox has no python3 to run a host-tool program")
        if not res.ok:
            raise HostToolChannelError(
                f"the host-tool launcher could not be started (exit {res.exit_code})"
            )
        words = res.stdout.decode("ascii", errors="replace").split()
        if len(words) != 3 or words[0] != "launched" or not all(w.isdigit() for w in words[1:]):
            # No identity to check the end against; the launcher runs, and a failure stops it
            # through the pid file (the ``finally`` of the run).
            raise HostToolChannelError("the host-tool launcher's identity could not be read")
        self.launcher = (words[1], words[2])

    async def serve(self, *, timeout: float, deadline: float) -> Finished:  # noqa: ASYNC109
        """Poll and answer until the program exits or ``deadline`` (monotonic) passes.

        An answer rides the next poll (see :data:`.guest.POLL`), so it is written even when the
        deadline passed while its tool ran: a handled call is always offered back before a stop."""
        sequence = 1
        pending: HostToolAnswer | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and pending is None:
                raise await self._overrun(timeout)
            budget = min(self.long_poll, remaining) if remaining > 0 else 0.0
            try:
                tick, out, err = await self._poll(sequence, budget, pending, deadline)
            except ExecTimeout:
                # Only a poll with no answer to deliver raises this (one that had an answer is
                # delivery_uncertain), and only past the deadline: a guest file that blocked
                # the poll does not move the run's end.
                if time.monotonic() < deadline:
                    raise
                raise await self._overrun(timeout) from None
            pending = None
            if tick.startswith("req"):
                pending = await self._handle(sequence, self._request(tick, out))
                sequence += 1
            elif tick.startswith("exit"):
                self.finished = True
                return self._finished(tick, out, err)
            elif tick != "idle":
                raise HostToolChannelError("the host-tool poll gave an answer it should not have")

    async def _handle(self, sequence: int, raw: bytes) -> HostToolAnswer:
        """Hand request ``sequence`` to the door, once."""
        if self.run.answered(sequence):  # unreachable: a fresh run, one pass per sequence
            raise HostToolChannelError(f"host-tool call {sequence} was already handled")
        answer = await self.run.handle_request(sequence, raw)
        if len(answer.payload) > self.sandbox.spec.files_in.max_bytes_per_file:
            # The door's cap was wider than the sandbox's: the answer cannot go in, and the
            # tool may have run. The same outcome as a refused write.
            self.run.delivery_failed(sequence)
            raise HostToolDeliveryUncertain(record=self._record(sequence), records=self.run.records)
        return answer

    def _record(self, sequence: int) -> HostToolCallRecord:
        return next(r for r in self.run.records if r.sequence == sequence)

    async def _poll(
        self, sequence: int, budget: float, answer: HostToolAnswer | None, deadline: float
    ) -> tuple[str, bytes, bytes]:
        """One exec (one round trip): write ``answer`` back, then wait up to ``budget`` seconds
        for request ``sequence`` (returned with its bytes) or the exit marker (returned with the
        exit code and the output). The answer is delivered when the guest says it wrote it; when
        the exec fails, is cancelled or the write failed, it is ``delivery_uncertain``."""
        ticks = max(0, int(budget / self.poll_interval))
        request_cap = self.run.max_request_bytes
        payload = answer.payload if answer is not None else b""
        argv = [
            "sh",
            "-c",
            POLL,
            "sbx-poll",
            self.layout.transport_path,
            str(sequence),
            str(ticks),
            f"{self.poll_interval:.3f}",
            str(self.output_cap + 1),
            str(request_cap),
            str(answer.sequence if answer is not None else 0),
            str(len(payload)),
            *self.launcher,
        ]
        # Never past the run's deadline by more than the grace, whatever the guest's files do.
        exec_timeout = min(
            budget + _EXEC_SLACK,
            max(deadline - time.monotonic(), budget) + _DEADLINE_GRACE,
        )
        try:
            res = await self.sandbox.exec(
                argv,
                stdin=payload or None,
                timeout=exec_timeout,
                max_output_bytes=2 * (self.output_cap + 1) + request_cap + 4096,
            )
            if not res.ok:
                raise HostToolChannelError(f"the host-tool poll failed (exit {res.exit_code})")
        except asyncio.CancelledError:
            if answer is not None:
                self.run.delivery_failed(answer.sequence)
            raise
        except Exception as exc:
            if answer is None:
                raise
            self.run.delivery_failed(answer.sequence)
            raise HostToolDeliveryUncertain(
                record=self._record(answer.sequence), records=self.run.records
            ) from exc
        stdout = res.stdout
        if answer is not None:
            status, _, stdout = stdout.partition(b"\n")
            if status != f"wrote {answer.sequence}".encode():
                self.run.delivery_failed(answer.sequence)
                raise HostToolDeliveryUncertain(
                    record=self._record(answer.sequence), records=self.run.records
                )
            self.run.delivered(answer.sequence, len(payload))
        head, _, rest = stdout.partition(b"\n")
        return head.decode("ascii", errors="replace"), rest, res.stderr

    def _request(self, tick: str, body: bytes) -> bytes:
        """The request bytes as the door should see them. A request above the cap was not sent
        (it stands in by its size alone, which the door refuses); one whose size the guest could
        not report (not a regular file) reaches the door empty, which it refuses as invalid."""
        size = tick[len("req") :].strip()
        if not size.isdigit():
            return b""
        if int(size) > self.run.max_request_bytes:
            return _OversizedRequest(int(size))
        return body

    def _finished(self, tick: str, out: bytes, err: bytes) -> Finished:
        for key, data in (("stdout", out), ("stderr", err)):
            if len(data) > self.output_cap:
                raise TransferCapExceeded(
                    direction="filesOut",
                    cap="max_bytes_per_file",
                    limit=self.output_cap,
                    actual=len(data),
                    path=self.layout.transport_file(TRANSPORT_FILES[key]),
                )
        marker = _Marker.parse(tick[len("exit") :], self.receipt)
        if marker is None or marker.ended < 0:
            reason = (
                "the launcher was gone without its own exit marker"
                if marker is None
                else "the launcher could not end every process the program left"
            )
            raise HostToolRunUnclean(
                reason=reason,
                stdout=out[: self.output_cap],
                stderr=err[: self.output_cap],
                records=self.run.records,
            )
        return Finished(marker.code, out, err, marker.ended)

    async def _overrun(self, timeout: float) -> HostToolRunTimeout:  # noqa: ASYNC109
        outcome, ended, out, err = await self.stop(self.output_cap + 1)
        truncated = len(out) > self.output_cap or len(err) > self.output_cap
        return HostToolRunTimeout(
            timeout=timeout,
            stdout=out[: self.output_cap],
            stderr=err[: self.output_cap],
            signal=outcome,
            records=self.run.records,
            truncated=truncated,
            leftovers_ended=ended,
        )

    async def stop(self, output_bytes: int = 0) -> tuple[SignalOutcome, int | None, bytes, bytes]:
        """End the program (one exec): ask the launcher to kill its group and every process left
        in its tree, or, when the launcher is gone, send SIGKILL to what the pid file names.
        Returns what the signal reached, how many processes the launcher says it ended
        (``None`` when it could not say so: see :class:`HostToolRunUnclean`) and up to
        ``output_bytes`` of each output file. Never raises: a signal that could not be sent is
        :attr:`SignalOutcome.NOT_SENT`."""
        self.signalled = True
        try:
            res = await self.sandbox.exec(
                [
                    "sh",
                    "-c",
                    STOP,
                    "sbx-stop",
                    self.layout.transport_path,
                    str(output_bytes),
                    *self.launcher,
                ],
                timeout=_STOP_TIMEOUT,
                max_output_bytes=2 * output_bytes + 4096,
            )
        except Exception as exc:
            log.warning(
                "host-tool run %s: the program could not be signalled (%s)",
                self.layout.run_id,
                type(exc).__name__,
            )
            return SignalOutcome.NOT_SENT, None, b"", b""
        head, _, rest = res.stdout.partition(b"\n")
        word, _, marker_text = head.decode("ascii", errors="replace").strip().partition(" ")
        try:
            outcome = SignalOutcome(word)
        except ValueError:
            outcome = SignalOutcome.NOT_SENT
        marker = _Marker.parse(marker_text, self.receipt)
        ended = marker.ended if marker is not None and marker.ended >= 0 else None
        if ended is None:
            log.warning(
                "host-tool run %s: its launcher did not say it ended every process the program "
                "started; some may still run in the sandbox",
                self.layout.run_id,
            )
        return outcome, ended, rest, res.stderr
