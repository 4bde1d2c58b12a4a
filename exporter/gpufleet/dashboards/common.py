"""What every gpufleet dashboard shares: the data source and variables, panel kinds with
their house defaults (title, description, unit, explicit id), the tag, links and grid.

Every panel and target reads the ``datasource`` variable, never a fixed UID; every
selector carries ``cluster=~"$cluster"`` (a hidden variable: one cluster matches every
series, a Thanos / Mimir setup with a ``cluster`` external label narrows to one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

TAG = "gpufleet"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
CLUSTER = 'cluster=~"$cluster"'
JOB = 'training_job="$training_job"'  # the job dashboards' variable, as a matcher
# The tenant variables as matchers. "All" is ".*", which also matches series without the
# label: the unallocated GPUs, jobs that report no namespace.
TENANT = 'namespace=~"$namespace"'
JOBS = 'training_job=~"$training_job"'
NODE_DASHBOARD = "gpufleet-node"
# Dashboard width in Grafana's grid units.
WIDTH = 24


def node_link(field_name: str = "node") -> str:
    """URL of the node dashboard for the row's node, keeping data source and time range."""
    return (
        f"/d/{NODE_DASHBOARD}/gpufleet-node?var-node=${{__data.fields.{field_name}}}"
        "&${datasource:queryparam}&${cluster:queryparam}&${__url_time_range}"
    )


def sel(*matchers: str) -> str:
    """A label selector body: the cluster matcher plus ``matchers``."""
    return ", ".join((CLUSTER, *matchers))


def quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> prom.Dataquery:
    query = prom.Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if instant:
        query = query.instant().format(pm.PromQueryFormat.TABLE)
    else:
        query = query.range().legend_format(legend or "__auto")
    return query


def targets(*queries: tuple[str, str]) -> list[prom.Dataquery]:
    """Range targets from (expression, legend) pairs, ref ids A, B, C..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


def thresholds(*steps: tuple[float | None, str]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=value, color=color) for value, color in steps])
    )


def limit(value: float) -> db.ThresholdsConfig:
    """Green below ``value``, red from it: the alert's own threshold, drawn on the panel."""
    return thresholds((None, "green"), (value, "red"))


class PanelBuilder(Protocol):
    """What every SDK panel builder (timeseries, stat, table, heatmap) offers."""

    def id(self, id_val: int) -> Self: ...
    def grid_pos(self, grid_pos: dm.GridPos) -> Self: ...
    def build(self) -> dm.Panel: ...


@dataclass
class Grid:
    """Places panels left to right in rows of 24 units, numbering their ids."""

    panels: list[dm.Panel] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _row_height: int = 0

    def add(self, panel: PanelBuilder, width: int, height: int) -> None:
        if self._x + width > WIDTH:
            self._x, self._y, self._row_height = 0, self._y + self._row_height, 0
        position = dm.GridPos(h=height, w=width, x=self._x, y=self._y)
        # Explicit ids: the SDK leaves them unset, and id 0 breaks panel links.
        self.panels.append(panel.id(len(self.panels) + 1).grid_pos(position).build())
        self._x += width
        self._row_height = max(self._row_height, height)

    # One method per panel kind: each places the panel its namesake function builds.
    def timeseries(self, width: int, height: int, /, *args: Any, **options: Any) -> None:
        """``timeseries_panel(*args, **options)`` placed ``width`` x ``height``."""
        self.add(timeseries_panel(*args, **options), width, height)

    def stat(self, width: int, height: int, /, *args: Any, **options: Any) -> None:
        """``stat_panel(*args, **options)`` placed ``width`` x ``height``."""
        self.add(stat_panel(*args, **options), width, height)

    def table(self, width: int, height: int, /, *args: Any, **options: Any) -> None:
        """``table_panel(*args, **options)`` placed ``width`` x ``height``."""
        self.add(table_panel(*args, **options), width, height)

    def heatmap(self, width: int, height: int, /, *args: Any, **options: Any) -> None:
        """``heatmap_panel(*args, **options)`` placed ``width`` x ``height``."""
        self.add(heatmap_panel(*args, **options), width, height)


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[prom.Dataquery],
    *,
    limit_at: float | None = None,
    stacked: bool = False,
    bars: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(list(queries))
        .line_width(1)
        .fill_opacity(30 if stacked or bars else 8)
        .show_points(common.VisibilityMode.AUTO)
        .legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            cb.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS)
    if stacked:
        panel = panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    if limit_at is not None:
        panel = panel.thresholds(limit(limit_at)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    return panel


def stat_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[prom.Dataquery],
    *,
    steps: db.ThresholdsConfig | None = None,
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(list(queries))
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        .thresholds(steps or thresholds((None, "blue")))
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def table_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[prom.Dataquery],
    *,
    link_node: bool = True,
    sort_by: str | None = None,
    descending: bool = True,
    columns: Sequence[str] = (),
) -> table.Panel:
    """An instant table; rows link to the node dashboard when they have a ``node``."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(list(queries))
        .show_header(True)
        .align(common.FieldTextAlignment.AUTO)
        .inspect(False)
        .cell_height(common.TableCellHeight.SM)
        .with_transformation(
            dm.DataTransformerConfig(id_val="merge" if len(queries) > 1 else "organize", options={})
        )
        .override_by_name("Time", [dm.DynamicConfigValue(id_val="custom.hidden", value=True)])
    )
    if link_node:
        panel = panel.override_by_name(
            "node",
            [
                dm.DynamicConfigValue(
                    id_val="links",
                    value=[{"title": "Open the node dashboard", "url": node_link()}],
                )
            ],
        )
    # Name the value columns: "Value #A" means nothing to the reader.
    for index, name in enumerate(columns):
        column = "Value" if len(queries) == 1 else f"Value #{chr(ord('A') + index)}"
        panel = panel.override_by_name(
            column, [dm.DynamicConfigValue(id_val="displayName", value=name)]
        )
    sort_by = sort_by or (columns[0] if columns else None)
    if sort_by is not None:
        panel = panel.sort_by([cb.TableSortByFieldState().display_name(sort_by).desc(descending)])
    return panel


def heatmap_panel(
    title: str, description: str, unit: str, queries: Sequence[prom.Dataquery]
) -> heatmap.Panel:
    """Rows are series (one per node), colour is the value: no bucketing."""
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(list(queries))
        .calculate(False)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(hm.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .steps(64)
        )
        .cell_gap(1)
        .scale_distribution(cb.ScaleDistributionConfig().type(common.ScaleDistribution.LINEAR))
        .y_axis(heatmap.YAxisConfig().unit(unit))
    )


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(
    name: str,
    label: str,
    query: str,
    *,
    include_all: bool = False,
    all_value: str | None = ".*",
    hide: bool = False,
) -> db.QueryVariable:
    """A ``label_values`` variable refreshed when the time range changes. With
    ``all_value=None``, "All" sends every value (a regex alternation), not a match-all."""
    variable = (
        db.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-values", "qryType": 1})
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )
    if include_all:
        variable = variable.include_all(True).current(
            dm.VariableOption(selected=True, text="All", value="$__all")
        )
        variable = variable.multi(all_value is None)
        if all_value is not None:
            variable = variable.all_value(all_value)
    if hide:
        variable = variable.hide(dm.VariableHide.HIDE_VARIABLE)
    return variable


def cluster_variable() -> db.QueryVariable:
    # Hidden: a single cluster has no such label, and ".*" matches series without it.
    return query_variable(
        "cluster", "Cluster", "label_values(up, cluster)", include_all=True, hide=True
    )


def namespace_variable(tenant_series: Sequence[str]) -> db.QueryVariable:
    """The tenant: a Kubernetes namespace holding GPUs or running training jobs."""
    names = "|".join(tenant_series)
    return query_variable(
        "namespace",
        "Namespace (tenant)",
        f'label_values({{__name__=~"{names}", {CLUSTER}}}, namespace)',
        include_all=True,
    )


def training_jobs_variable(job_tenant: str) -> db.QueryVariable:
    """The chosen tenant's training jobs (several, or All)."""
    return query_variable(
        "training_job",
        "Training job",
        f"label_values({job_tenant}{{{sel(TENANT)}}}, training_job)",
        include_all=True,
    )


def tenant_gpus(expr: str, gpu_tenant: str) -> str:
    """``expr`` (per-GPU series, with UUID) for the chosen tenant's GPUs only; "All" keeps
    every GPU, the unallocated ones too (gpu_tenant has a series for each GPU)."""
    return f"(\n  (\n    {expr}\n  )\n  and on (UUID) {gpu_tenant}{{{sel(TENANT)}}}\n)"


def tenant_jobs(expr: str, job_tenant: str, *, jobs: bool = True) -> str:
    """``expr`` (series with training_job) for the chosen tenant's (and jobs') only."""
    matchers = sel(TENANT, JOBS) if jobs else sel(TENANT)
    return f"(\n  (\n    {expr}\n  )\n  and on (training_job) {job_tenant}{{{matchers}}}\n)"


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: Sequence[db.QueryVariable],
    grid: Grid,
    *,
    annotations: Sequence[db.AnnotationQuery] = (),
    time_from: str = "now-30m",
) -> dm.Dashboard:
    # 30 minutes by default: a page's window and what led up to it, and the whole of the
    # ten-minute demo; the reliability dashboard asks for days.
    builder = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .timezone("utc")
        .readonly()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time(time_from, "now")
        .refresh("1m")
        .with_variable(datasource_variable())
        .with_variable(cluster_variable())
        .link(
            db.DashboardLink("gpufleet")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for variable in variables:
        builder = builder.with_variable(variable)
    for annotation in annotations:
        builder = builder.annotation(annotation)
    built = builder.build()
    built.panels = list(grid.panels)
    return built


def render(board: dm.Dashboard) -> str:
    """The dashboard as committed: stable key order, two-space indent."""
    return json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
