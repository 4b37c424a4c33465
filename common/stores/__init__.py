"""One module per kind of store behind the storage door (`common/storage.py`): how to open it
with pyarrow, and the writes it guarantees (whole-object writes, create-if-absent,
replace-if-unchanged), each with the store's own mechanism."""
