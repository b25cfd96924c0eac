# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drain runner's journal: its own records, its batches' lines, and the
unit's StatusText. Part of batchq-drain, installed beside it.

A batch's stdout and stderr are a pipe to the runner, which sends each line
to journald itself, over journald's native socket. journald attributes a
line to a unit and a run by looking up its sender's cgroup. A batch that
prints and exits at once is gone before journald looks it up (a stream names
its unit only when root sends it), so its lines would miss `journalctl -u`.
The runner lives for the whole run: journald sees it alive at its first
record (waited for, wait_read()), keeps what it learnt of it, and every later
record, the last batch's too, carries the unit and the run. Readers match the
records on _SYSTEMD_INVOCATION_ID and _PID (the runner's), which no other
process can forge.
"""

import fcntl
import os
import socket
import sys
import termios
import time

import consumer_protocol

JOURNAL_SOCKET = "/run/systemd/journal/socket"


class Journal:
    """Records to journald's native socket from this process, or to stderr when
    there is no journald (run by hand)."""

    # journald splits longer lines (its LineMax= default): a record stays one datagram
    LINE_MAX = 48 * 1024

    def __init__(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.connect(JOURNAL_SOCKET)
        except OSError:
            self.sock.close()
            self.sock = None

    def send(self, fields):
        """One entry; a value may hold any bytes but a newline."""
        payload = b"".join(b"%s=%s\n" % (key.encode(), value if isinstance(value, bytes) else str(value).encode())
                           for key, value in fields.items())
        if self.sock is not None:
            try:
                self.sock.send(payload)
                return
            except OSError:
                pass  # journald went away, or refused the size: say it on stderr
        os.write(2, fields["MESSAGE"] + b"\n" if isinstance(fields["MESSAGE"], bytes)
                 else ("%s\n" % fields["MESSAGE"]).encode())

    def say(self, message, priority, message_id=None):
        """One record of the runner's own."""
        fields = {"MESSAGE": message, "PRIORITY": priority, "SYSLOG_IDENTIFIER": consumer_protocol.RUNNER_IDENTIFIER}
        if message_id:
            fields["MESSAGE_ID"] = message_id
        self.send(fields)

    def line(self, text, identifier, number):
        """One line a batch wrote, under its identifier and number."""
        for start in range(0, max(len(text), 1), self.LINE_MAX):
            self.send({"MESSAGE": text[start:start + self.LINE_MAX], "PRIORITY": 6,
                       "SYSLOG_IDENTIFIER": identifier, "BATCHQ_BATCH": number})

    def wait_read(self, patience):
        """Wait until journald has read every record sent (SIOCOUTQ: the bytes
        it has not taken off the socket yet), at most patience seconds."""
        if self.sock is None:
            return
        deadline = time.monotonic() + patience
        unread = bytearray(4)
        while time.monotonic() < deadline:
            fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, unread)
            if not int.from_bytes(unread, sys.byteorder):
                return
            time.sleep(0.001)


def notify_status(text):
    """Say how the last batch ended in the unit's StatusText (NotifyAccess=main:
    no batch can, and systemd keeps it until the next run starts): the batch
    count and result of a run, whatever the journal dropped."""
    notify("STATUS=" + text)


def notify(message):
    """Send message (sd_notify's "KEY=value" lines) to systemd, if it listens."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), "\0" + address[1:] if address[0] == "@" else address)
    except OSError:
        pass
