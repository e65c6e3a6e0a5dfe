"""Shared helpers of the benchmark scripts."""

from __future__ import annotations

import gc
import threading
import time

import psutil


class PeakRSS:
    """Context manager: the resident-memory high-water mark above the level at entry (``delta_mb``)."""

    def __init__(self, interval: float = 0.005):
        self.proc = psutil.Process()
        self.interval = interval

    def __enter__(self):
        gc.collect()
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.delta_mb = (self.peak - self.start) / 2**20
