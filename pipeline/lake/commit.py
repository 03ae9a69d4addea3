"""Publishing a micro-batch's Parquet files exactly once, whatever crashes in between.

The lake writes two tables from one read of Kafka (the records, and the values that don't
match the schema), which Spark's file sink can't do in one query. So each micro-batch is
written by Spark into a staging directory and then published by this module, keyed by the
micro-batch id that Spark's checkpoint keeps:

1. if `OUT/_kipside/commits/<id>` exists, the batch was published (Spark re-runs the last
   micro-batch after a crash that came before its own commit): nothing is written, and what
   step 5 had not yet removed (a crash right after the marker) is removed;
2. otherwise whatever an earlier attempt left is removed: its staging directory, and the
   published files its manifest lists;
3. Spark writes the batch under `OUT/_kipside/staging/<id>/`;
4. the manifest `OUT/_kipside/manifests/<id>` lists every final path, then each staged file is
   renamed to it (`part-b<id>-<n>...parquet`, in the same partition directory);
5. the commit marker is written and the staging directory and manifest are removed.

A crash at any step leaves either nothing visible or files the manifest lists, which the next
attempt of the same batch removes before writing it again: every record lands once. The crash
tests' fault point (pipeline.lake.faults) is in step 4, after the first rename. Between a
crash and the restart, readers may see part of the interrupted batch. Names starting with `_`
are hidden from Spark and pyarrow readers of OUT. Paths go through Hadoop's FileSystem (the
JVM's), so OUT can be a local directory, HDFS or an object store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .faults import crash_point

__all__ = ["BatchPublisher", "Published"]

_KEEP_MARKERS: Final = 100  # Spark keeps 100 batches of its checkpoint by default


@dataclass(frozen=True)
class Published:
    files: list[str]
    bytes: int


class BatchPublisher:
    def __init__(self, spark: Any, out: str, quarantine: str) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.out = out.rstrip("/")
        self.quarantine = quarantine.rstrip("/")
        self.meta = f"{self.out}/_kipside"

    # Hadoop FileSystem -------------------------------------------------------------------

    def _path(self, text: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(text)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def exists(self, text: str) -> bool:
        path = self._path(text)
        return bool(self._fs(path).exists(path))

    def delete(self, text: str) -> None:
        path = self._path(text)
        self._fs(path).delete(path, True)

    def _write(self, text: str, content: str) -> None:
        path = self._path(text)
        stream = self._fs(path).create(path, True)
        try:
            stream.write(bytearray(content.encode("utf-8")))
        finally:
            stream.close()

    def _read(self, text: str) -> str:
        path = self._path(text)
        stream = self._fs(path).open(path)
        try:
            # py4j copies arrays across the bridge, so the JVM reads the text itself.
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def _files(self, root: str) -> list[tuple[str, int]]:
        """Every Parquet file under root (recursively): (path, bytes)."""
        path = self._path(root)
        fs = self._fs(path)
        if not fs.exists(path):
            return []
        out = []
        found = fs.listFiles(path, True)
        while found.hasNext():
            status = found.next()
            name = str(status.getPath().getName())
            if name.endswith(".parquet"):
                out.append((str(status.getPath().toString()), int(status.getLen())))
        return sorted(out)

    # The protocol -----------------------------------------------------------------------

    def staging(self, batch_id: int, kind: str) -> str:
        return f"{self.meta}/staging/{batch_id}/{kind}"

    def done(self, batch_id: int) -> bool:
        return self.exists(f"{self.meta}/commits/{batch_id}")

    def tidy(self, batch_id: int) -> None:
        """Remove a published batch's staging directory and manifest (never its files)."""
        self.delete(f"{self.meta}/staging/{batch_id}")
        self.delete(f"{self.meta}/manifests/{batch_id}")

    def clean(self, batch_id: int) -> None:
        """Undo what an interrupted attempt of this batch left behind."""
        manifest = f"{self.meta}/manifests/{batch_id}"
        if self.exists(manifest):
            for line in self._read(manifest).splitlines():
                if line.strip():
                    self.delete(line.strip())
            self.delete(manifest)
        self.delete(f"{self.meta}/staging/{batch_id}")

    def publish(self, batch_id: int) -> Published:
        moves: list[tuple[str, str, int]] = []
        for kind, target in (("data", self.out), ("quarantine", self.quarantine)):
            staged = self._path(self.staging(batch_id, kind))
            root = str(self._fs(staged).makeQualified(staged).toString())
            for n, (path, size) in enumerate(self._files(self.staging(batch_id, kind))):
                relative = path[len(root) :].lstrip("/")
                folder, _, name = relative.rpartition("/")
                suffix = name.split(".", 1)[1] if "." in name else "parquet"
                prefix = f"{target}/{folder}/" if folder else f"{target}/"
                final = f"{prefix}part-b{batch_id:012d}-{n:05d}.{suffix}"
                moves.append((path, final, size))
        self._write(f"{self.meta}/manifests/{batch_id}", "\n".join(f for _, f, _ in moves) + "\n")
        for n, (source, final, _size) in enumerate(moves):
            if n == 1:
                crash_point(batch_id)  # part of the batch visible, the rest staged: the worst
            target = self._path(final)
            fs = self._fs(target)
            fs.mkdirs(target.getParent())
            if not fs.rename(self._path(source), target):
                raise OSError(f"could not move {source} to {final}")
        self._write(f"{self.meta}/commits/{batch_id}", "")
        self.tidy(batch_id)
        old = batch_id - _KEEP_MARKERS
        if old >= 0:
            self.delete(f"{self.meta}/commits/{old}")
        return Published([final for _, final, _ in moves], sum(size for _, _, size in moves))
