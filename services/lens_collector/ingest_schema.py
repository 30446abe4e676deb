"""DDL of the ingest path: Null-engine tables that take telemetry messages as
the agents and the SDK published them (JSONEachRow) and materialized views
that spread them into the telemetry tables. Migration 5 made them; migration
6 remade ``ingest_node`` to read both wire forms of ``telemetry.node``: GPUs
and NICs as lists of objects (version 1) and as columns (version 2,
``gpu_columns`` and ``nic_columns``). ``node_ingest`` makes that table and
its views for a list of GPU fields, so a later migration that adds fields
remakes them the same way (migration 9, ``gpu_jobs_schema``).

The engine parses the JSON in C++ and checks it with CHECK constraints:
types, keys that are valid subject tokens, required fields. Required
fields are Nullable here so that a missing one fails the CHECK (and the
message goes to pydantic for its reason) instead of silently becoming 0.
See ``ingest`` for the Python side.
"""

from __future__ import annotations

from collections.abc import Callable

from libs.events import KEY_PATTERN

_GPU_TYPES = (
    ("util_pct", "Float32"), ("vram_used_bytes", "UInt64"), ("vram_total_bytes", "UInt64"),
    ("temp_c", "Float32"), ("power_w", "Float32"), ("temp_junction_c", "Float32"),
    ("temp_hbm_c", "Float32"), ("power_cap_w", "Float32"), ("sclk_mhz", "Float32"),
    ("mclk_mhz", "Float32"), ("ecc_correctable", "UInt64"), ("ecc_uncorrectable", "UInt64"),
    ("pcie_rx_bytes_s", "Float64"), ("pcie_tx_bytes_s", "Float64"),
    ("xgmi_rx_bytes_s", "Float64"), ("xgmi_tx_bytes_s", "Float64"),
)
_KEY = KEY_PATTERN.replace("{", "{{").replace("}", "}}")  # str.format escapes
# A GPU field of the ingest table: its name, its type there and what the
# views store of a value ``{v}`` (the readings: the value as it came).
GpuField = tuple[str, str, str]
GPU_READINGS: tuple[GpuField, ...] = tuple((n, t, "{v}") for n, t in _GPU_TYPES)


def _map(items: str, key: str, value: str, keep: str = "") -> str:
    """A Map from an Array(Tuple) column: ``key`` -> ``value`` of each item kept."""
    src = f"arrayFilter(x -> {keep}, {items})" if keep else items
    return (f"mapFromArrays(arrayMap(x -> tupleElement(x, '{key}'), {src}), "
            f"arrayMap(x -> tupleElement(x, '{value}'), {src}))")


_RDMA = "tupleElement(x, 'rdma')"


def _v1_nic_map(value: str, rdma: bool) -> str:
    return _map("data.nics", "name", value, f"{'' if rdma else 'NOT '}{_RDMA}")


def _col(name: str, columns: str = "gpu_columns") -> str:
    """One array of a version 2 column group (``gpu_columns``, ``nic_columns``)."""
    return f"tupleElement(tupleElement(data, '{columns}'), '{name}')"


def _nic_map(value: str, rdma: bool) -> str:
    """name -> ``value`` of the NICs (RDMA ports or not) in either wire form."""
    names = _col("name", "nic_columns")
    # rdma may be left out (all false); [i] past the end reads false.
    flags = f"arrayMap(i -> {_col('rdma', 'nic_columns')}[i], arrayEnumerate({names}))"
    keep = "r" if rdma else "NOT r"
    rows = f"arrayFilter(x -> {'' if rdma else 'NOT '}{_RDMA}, data.nics)"
    keys = (f"arrayConcat(arrayMap(x -> tupleElement(x, 'name'), {rows}), "
            f"arrayFilter((n, r) -> {keep}, {names}, {flags}))")
    values = (f"arrayConcat(arrayMap(x -> tupleElement(x, '{value}'), {rows}), "
              f"arrayFilter((v, r) -> {keep}, {_col(value, 'nic_columns')}, {flags}))")
    return f"mapFromArrays({keys}, {values})"


def _host_view(gpu_count: str, nic_map: Callable[[str, bool], str]) -> str:
    """node_metrics from ingest_node: the host readings, NICs, disks and filesystems."""
    return f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.ingest_node_host
    TO {{db}}.node_metrics AS
    SELECT time, node, id AS event_id, assumeNotNull(data.cpu_pct) AS cpu_pct,
           assumeNotNull(data.mem_used_bytes) AS mem_used_bytes,
           assumeNotNull(data.mem_total_bytes) AS mem_total_bytes,
           assumeNotNull(data.load1) AS load1, {gpu_count} AS gpu_count,
           ifNull(data.gpu_tool, '') AS gpu_tool,
           {nic_map("rx_bytes_s", False)} AS net_rx_bytes_s,
           {nic_map("tx_bytes_s", False)} AS net_tx_bytes_s,
           {nic_map("rx_bytes_s", True)} AS rdma_rx_bytes_s,
           {nic_map("tx_bytes_s", True)} AS rdma_tx_bytes_s,
           {_map("data.disks", "name", "read_bytes_s")} AS disk_read_bytes_s,
           {_map("data.disks", "name", "write_bytes_s")} AS disk_write_bytes_s,
           {_map("data.filesystems", "mount", "free_bytes")} AS fs_free_bytes,
           {_map("data.filesystems", "mount", "total_bytes")} AS fs_total_bytes
    FROM {{db}}.ingest_node"""


_HOST_FIELDS = """cpu_pct Nullable(Float64), mem_used_bytes Nullable(UInt64),
            mem_total_bytes Nullable(UInt64), load1 Nullable(Float64),
            gpu_tool Nullable(String)"""


def _gpu_rows(fields: tuple[GpuField, ...]) -> str:
    return ("gpus Array(Tuple(index Nullable(UInt8), "
            f"{', '.join(f'{n} Nullable({t})' for n, t, _ in fields)}))")


_GPU_ROWS = _gpu_rows(GPU_READINGS)
_OTHER_ROWS = """nics Array(Tuple(name String, rx_bytes_s Float64, tx_bytes_s Float64, rdma Bool)),
            disks Array(Tuple(name String, read_bytes_s Float64, write_bytes_s Float64)),
            filesystems Array(Tuple(mount String, free_bytes UInt64, total_bytes UInt64))"""
_NODE_CHECKS = f"""CONSTRAINT is_node_telemetry CHECK type = 'telemetry.node',
        CONSTRAINT node_is_a_key CHECK match(node, '{_KEY}'),
        CONSTRAINT required CHECK isNotNull(data.cpu_pct) AND isNotNull(data.mem_used_bytes)
            AND isNotNull(data.mem_total_bytes) AND isNotNull(data.load1)
            AND data.cpu_pct >= 0 AND data.load1 >= 0
            AND arrayAll(g -> isNotNull(tupleElement(g, 'index')), data.gpus)"""



def _gpu_rows_view(fields: tuple[GpuField, ...]) -> str:
    values = ", ".join(v.format(v=f"tupleElement(g, '{n}')") + f" AS {n}" for n, _, v in fields)
    return f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.ingest_node_gpus
    TO {{db}}.gpu_metrics AS
    SELECT time, node, assumeNotNull(tupleElement(g, 'index')) AS gpu, id AS event_id,
           {values}
    FROM {{db}}.ingest_node ARRAY JOIN data.gpus AS g"""


_GPU_ROWS_VIEW = _gpu_rows_view(GPU_READINGS)

INGEST_MIGRATION: tuple[str, ...] = (
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_node (
        id String, type String, time DateTime64(6, 'UTC'), source String, node String,
        data Tuple(
            {_HOST_FIELDS},
            {_GPU_ROWS},
            {_OTHER_ROWS}),
        {_NODE_CHECKS}
    ) ENGINE = Null""",
    _GPU_ROWS_VIEW,
    _host_view("length(data.gpus)", _v1_nic_map),
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_job (
        id String, type String, time DateTime64(6, 'UTC'), source String,
        node Nullable(String), job String,
        data Tuple(rank Nullable(UInt16), attempt Nullable(UInt16), iteration Nullable(UInt64),
                   loss Nullable(Float64), throughput Nullable(Float64),
                   step_time_s Nullable(Float64), checkpoint_path Nullable(String),
                   loss_nonfinite Nullable(String), grad_norm Nullable(Float64),
                   tokens_per_s Nullable(Float64), checkpoint_bytes Nullable(UInt64),
                   checkpoint_duration_s Nullable(Float64), dropped Nullable(UInt64)),
        CONSTRAINT is_job_telemetry CHECK type = 'telemetry.job',
        CONSTRAINT keys CHECK match(job, '{_KEY}')
            AND (isNull(node) OR match(assumeNotNull(node), '{_KEY}')),
        CONSTRAINT required CHECK isNotNull(data.rank) AND isNotNull(data.iteration)
    ) ENGINE = Null""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_job_rows TO {db}.job_metrics AS
    SELECT time, job, assumeNotNull(data.rank) AS rank, ifNull(data.attempt, 1) AS attempt,
           ifNull(node, '') AS node, id AS event_id, assumeNotNull(data.iteration) AS iteration,
           if(isNull(data.loss_nonfinite), data.loss, toFloat64OrNull(data.loss_nonfinite))
               AS loss,
           data.throughput AS throughput, data.step_time_s AS step_time_s,
           data.checkpoint_path AS checkpoint_path, data.grad_norm AS grad_norm,
           data.tokens_per_s AS tokens_per_s, data.checkpoint_bytes AS checkpoint_bytes,
           data.checkpoint_duration_s AS checkpoint_duration_s, data.dropped AS dropped
    FROM {db}.ingest_job""",
    f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_log (
        id String, type String, time DateTime64(6, 'UTC'), source String,
        node Nullable(String), job Nullable(String),
        data Tuple(level String, message Nullable(String), service String, fields String),
        CONSTRAINT is_log_record CHECK type = 'log.record',
        CONSTRAINT keys CHECK (isNull(node) OR match(assumeNotNull(node), '{_KEY}'))
            AND (isNull(job) OR match(assumeNotNull(job), '{_KEY}')),
        CONSTRAINT required CHECK isNotNull(data.message)
    ) ENGINE = Null""",
    """CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ingest_log_rows TO {db}.logs AS
    SELECT time, id, if(data.service = '', source, data.service) AS service,
           data.level AS level, ifNull(node, '') AS node, ifNull(job, '') AS job,
           assumeNotNull(data.message) AS message,
           if(data.fields = '', '{{}}', data.fields) AS fields
    FROM {db}.ingest_log""",
)

# Version 2: one array per reading. A reading no GPU of the node has is left
# out of the message, so its array is empty here and `arr[i]` reads NULL.
# NICs likewise (nic_columns); their rates are required, so their arrays are too.


def _gpu_columns(fields: tuple[GpuField, ...]) -> str:
    return ("gpu_columns Tuple(index Array(Nullable(UInt8)), "
            f"{', '.join(f'{n} Array(Nullable({t}))' for n, t, _ in fields)})")


def _same_length(fields: tuple[GpuField, ...]) -> str:
    return (f"arrayAll(n -> n = 0 OR n = length({_col('index')}), "
            f"[{', '.join(f'length({_col(n)})' for n, _, _ in fields)}])")


_NIC_COLUMNS = ("nic_columns Tuple(name Array(String), rx_bytes_s Array(Float64), "
                "tx_bytes_s Array(Float64), rdma Array(Bool))")
_NIC_COUNT = f"length({_col('name', 'nic_columns')})"
_NICS_SAME_LENGTH = (
    f"length({_col('rx_bytes_s', 'nic_columns')}) = {_NIC_COUNT} "
    f"AND length({_col('tx_bytes_s', 'nic_columns')}) = {_NIC_COUNT} "
    f"AND length({_col('rdma', 'nic_columns')}) IN (0, {_NIC_COUNT}) "
    f"AND (empty(data.nics) OR {_NIC_COUNT} = 0)")

def keys_check(field: str) -> str:
    """A CHECK that the GPU field ``field`` holds keys (valid subject
    tokens) or NULLs, in both wire forms."""
    ok = f"isNull(x) OR match(assumeNotNull(x), '{_KEY}')"
    return (f"arrayAll(x -> {ok}, arrayMap(g -> tupleElement(g, '{field}'), data.gpus)) "
            f"AND arrayAll(x -> {ok}, {_col(field)})")


def node_ingest(fields: tuple[GpuField, ...], checks: str = "") -> tuple[str, ...]:
    """``ingest_node`` and its views, remade (the table holds no data: Null
    engine) for GPUs with ``fields``; ``checks``: more CHECK constraints."""
    return (
        "DROP VIEW IF EXISTS {db}.ingest_node_gpus",
        "DROP VIEW IF EXISTS {db}.ingest_node_gpu_columns",
        "DROP VIEW IF EXISTS {db}.ingest_node_host",
        "DROP TABLE IF EXISTS {db}.ingest_node",
        f"""CREATE TABLE IF NOT EXISTS {{db}}.ingest_node (
        id String, type String, time DateTime64(6, 'UTC'), source String, node String,
        data Tuple(
            {_HOST_FIELDS},
            {_gpu_rows(fields)},
            {_gpu_columns(fields)},
            {_NIC_COLUMNS},
            {_OTHER_ROWS}),
        {_NODE_CHECKS},
        CONSTRAINT gpu_columns CHECK {_same_length(fields)}
            AND arrayAll(i -> isNotNull(i), {_col('index')})
            AND (empty(data.gpus) OR empty({_col('index')})),
        CONSTRAINT nic_columns CHECK {_NICS_SAME_LENGTH}{checks}
    ) ENGINE = Null""",
        _gpu_rows_view(fields),
        f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {{db}}.ingest_node_gpu_columns
    TO {{db}}.gpu_metrics AS
    SELECT time, node, assumeNotNull({_col('index')}[i]) AS gpu, id AS event_id,
           {", ".join(v.format(v=f"{_col(n)}[i]") + f" AS {n}" for n, _, v in fields)}
    FROM {{db}}.ingest_node ARRAY JOIN arrayEnumerate({_col('index')}) AS i""",
        _host_view(f"length(data.gpus) + length({_col('index')})", _nic_map),
    )


INGEST_COLUMNS_MIGRATION: tuple[str, ...] = node_ingest(GPU_READINGS)
