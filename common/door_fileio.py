"""pyiceberg's FileIO through the storage door, so pyiceberg reads and writes the tables' files
(metadata, manifests, data and delete files) at the same URIs, with the same stores, as every
other icekeeper file.

pyiceberg's own PyArrowFileIO cannot open the one Azure URI form icekeeper uses,
`abfss://<container>@<account>.dfs.core.windows.net/<path>`: it gives pyarrow `container@host` as
the container name (HTTP 400), and its other IO (adlfs) is another package with other URIs. This
FileIO keeps pyarrow's file handling and only asks the door (`common/storage.py`) which filesystem
and path a location is. `open_catalog` sets it as `py-io-impl` on every store (local folders and S3
too) unless the config names a FileIO of its own, so the tables' bytes take the same door, with
the same settings and retries, as the roles' own files.
"""

from __future__ import annotations

import posixpath

from pyarrow.fs import FileSystem
from pyiceberg.io import S3_RETRY_STRATEGY_IMPL, InputFile, OutputFile
from pyiceberg.io.pyarrow import ONE_MEGABYTE, PyArrowFile, PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

from icekeeper.common.internals import s3_filesystem_with_delayed_open
from icekeeper.common.storage import (
    StorageSettings,
    configure_storage,
    make_folder,
    open_filesystem,
    storage_settings,
)

BUFFER_SIZE = "buffer-size"


def _door_filesystem(scheme: str, netloc: str | None) -> FileSystem:
    """The door's filesystem for a scheme and authority (`PyArrowFileIO.fs_by_scheme`'s role)."""
    return open_filesystem(f"{scheme}://{netloc or ''}/")[0]


class DoorFileIO(PyArrowFileIO):
    """PyArrowFileIO whose locations are opened by the storage door."""

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties)
        # pyiceberg's `fs_by_scheme` is a cache around a method bound to this FileIO: a reference
        # cycle, so every FileIO (a few each commit) waited for Python's cyclic collector. Only
        # PyArrowFileIO's own opening methods call it, all replaced here by the door's.
        self.fs_by_scheme = _door_filesystem
        if not storage_settings().properties:
            # A process that did not open the catalog itself (an unpickled FileIO).
            configure_storage(StorageSettings.from_properties(dict(properties)))

    def _file(self, location: str) -> PyArrowFile:
        filesystem, path = open_filesystem(location)
        return PyArrowFile(
            fs=filesystem,
            location=location,
            path=path,
            buffer_size=int(self.properties.get(BUFFER_SIZE, ONE_MEGABYTE)),
        )

    def new_input(self, location: str) -> PyArrowFile:
        return self._file(location)

    def new_output(self, location: str) -> PyArrowFile:
        filesystem, path = open_filesystem(location)
        # A local folder must exist before a file in it (pyiceberg's own IO makes it too).
        make_folder(filesystem, posixpath.dirname(path))
        return self._file(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        uri = location.location if isinstance(location, (InputFile, OutputFile)) else location
        filesystem, path = open_filesystem(uri)
        filesystem.delete_file(path)


class SinglePutFileIO(PyArrowFileIO):
    """pyiceberg's own FileIO (its S3 settings, credentials a REST catalog vends per table, and
    all), except that a file under pyarrow's part size goes to S3 in one PUT.

    pyarrow's S3 output stream starts a multipart upload when the file is opened, then uploads a
    part and completes the upload at its close: three requests for every manifest and manifest
    list a commit writes, where one PUT does (bench/results.md has the two timed against each
    other). `allow_delayed_open` makes pyarrow wait for the close to choose; pyiceberg 0.12 does
    not set it. Its filesystem is rebuilt with the same options (pyarrow's own pickling copy)
    plus that one; with a retry strategy configured (`s3.retry-strategy-impl`, which that copy
    would drop) pyiceberg's is kept as it is."""

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        filesystem = super()._initialize_s3_fs(netloc)
        if self.properties.get(S3_RETRY_STRATEGY_IMPL):
            return filesystem
        return s3_filesystem_with_delayed_open(filesystem)
