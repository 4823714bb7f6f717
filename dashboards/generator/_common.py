"""Shared pieces of the mfuscope dashboards: data source, template variables, panel factories.

Every factory requires a description and a unit, so no panel can ship without them (the tests
check the generated JSON as well). Units are Grafana unit ids: `percentunit` for 0..1 ratios,
`s`, `Bps` (bytes/s, SI), `bytes` (IEC), `flops` (FLOP/s), `none`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus as prometheus_builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import prometheus as prometheus_models

__all__ = [
    "JOB",
    "JOB_AXIS_TIER",
    "Panel",
    "Query",
    "Row",
    "bargauge_panel",
    "build_dashboard",
    "stat_panel",
    "table_panel",
    "timeseries_panel",
    "to_json",
]

# Every query goes to the data source the user picks in the `datasource` variable.
DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label matchers for the template variables. `=~` so that multi-value and "All" (`.*`) work.
JOB = 'job=~"$job"'
JOB_AXIS_TIER = 'job=~"$job", axis=~"$axis", tier=~"$tier"'

# Colours of the Grafana palette used for thresholds.
GREEN, AMBER, RED, BLUE = "green", "orange", "red", "blue"

Panel = Any  # a grafana_foundation_sdk panel builder
Threshold = tuple[float | None, str]  # (lower bound or None for the base, colour)


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel. `legend` is a Grafana legend template (`{{label}}`)."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass(frozen=True)
class Row:
    """A titled row of panels, laid out left to right in the order given."""

    title: str
    panels: Sequence[Panel] = field(default_factory=tuple)


def _targets(queries: Sequence[Query]) -> list[Any]:
    targets = []
    for index, query in enumerate(queries):
        target = (
            prometheus_builders.Dataquery()
            .expr(query.expr)
            .ref_id(chr(ord("A") + index))
            .legend_format(query.legend or "__auto")
        )
        target = target.instant() if query.instant else target.range()
        if query.table:
            target = target.format(prometheus_models.PromQueryFormat.TABLE)
        targets.append(target)
    return targets


def _thresholds(steps: Sequence[Threshold]) -> Any:
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_models.Threshold(value=value, color=color) for value, color in steps])
    )


def _common(
    panel: Panel,
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    thresholds: Sequence[Threshold] | None,
    width: int,
    height: int,
) -> Panel:
    if not description.strip():
        raise ValueError(f"panel {title!r} needs a description")
    if not unit:
        raise ValueError(f"panel {title!r} needs a unit")
    panel = (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .targets(_targets(queries))
        .span(width)
        .height(height)
    )
    # Without thresholds of its own a panel still gets one neutral step, so Grafana does not
    # colour it with its default (green base, red at 80), which would mean nothing here.
    return panel.thresholds(_thresholds(thresholds or [(None, BLUE)]))


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    thresholds: Sequence[Threshold] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    stacked: bool = False,
    dashed_series_regex: str | None = None,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """A time series panel; thresholds, if any, are drawn as dashed lines."""
    panel = _common(
        timeseries.Panel(), title, description, unit, queries, thresholds, width, height
    )
    panel = (
        panel.line_width(1)
        .fill_opacity(40 if stacked else 10)
        .show_points(common_models.VisibilityMode.NEVER)
    )
    panel = panel.legend(
        common_builders.VizLegendOptions()
        .display_mode(common_models.LegendDisplayMode.TABLE)
        .placement(common_models.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "mean", "max"])
    ).tooltip(
        common_builders.VizTooltipOptions()
        .mode(common_models.TooltipDisplayMode.MULTI)
        .sort(common_models.SortOrder.DESCENDING)
    )
    if thresholds:
        panel = panel.thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(
                common_models.GraphThresholdsStyleMode.DASHED
            )
        )
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common_models.StackingMode.NORMAL)
        )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if dashed_series_regex is not None:
        panel = panel.override_by_regexp(
            dashed_series_regex,
            [
                dashboard_models.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                dashboard_models.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
                dashboard_models.DynamicConfigValue(
                    id_val="custom.stacking", value={"mode": "none"}
                ),
            ],
        )
    return panel


def stat_panel(
    title: str,
    description: str,
    unit: str,
    query: Query,
    *,
    thresholds: Sequence[Threshold] | None = None,
    mappings: dict[str, tuple[str, str]] | None = None,
    decimals: int | None = None,
    width: int = 4,
    height: int = 4,
) -> Panel:
    """A single big number (the last value). `mappings`: value -> (text, colour)."""
    panel = _common(stat.Panel(), title, description, unit, [query], thresholds, width, height)
    panel = (
        panel.reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .graph_mode(common_models.BigValueGraphMode.AREA)
        .text_mode(common_models.BigValueTextMode.VALUE)
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    if mappings:
        panel = panel.mappings(
            [
                dashboard_models.ValueMap(
                    options={
                        value: dashboard_models.ValueMappingResult(text=text, color=color)
                        for value, (text, color) in mappings.items()
                    }
                )
            ]
        )
    return panel


def bargauge_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    thresholds: Sequence[Threshold] | None = None,
    min_value: float | None = None,
    max_value: float | None = None,
    width: int = 12,
    height: int = 8,
) -> Panel:
    """Horizontal bars, one per series (the last value), coloured by the thresholds."""
    panel = _common(bargauge.Panel(), title, description, unit, queries, thresholds, width, height)
    panel = (
        panel.reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .orientation(common_models.VizOrientation.HORIZONTAL)
        .display_mode(common_models.BarGaugeDisplayMode.BASIC)
        .show_unfilled(True)
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def table_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    renames: dict[str, str],
    sort_by: str | None = None,
    thresholds: Sequence[Threshold] | None = None,
    colored_column: str | None = None,
    column_units: dict[str, str] | None = None,
    width: int = 24,
    height: int = 8,
) -> Panel:
    """A table of instant queries merged on their labels.

    `renames` maps the merged columns (`Value #A`, `Value #B`, ..., or label names) to titles;
    columns not named there (`Time`, `__name__`, other labels) are hidden.
    """
    panel = _common(table.Panel(), title, description, unit, queries, thresholds, width, height)
    panel = panel.with_transformation(
        dashboard_models.DataTransformerConfig(id_val="merge", options={})
    ).with_transformation(
        dashboard_models.DataTransformerConfig(
            id_val="organize",
            options={
                "excludeByName": {"Time": True, "__name__": True},
                "includeByName": dict.fromkeys(renames, True),
                "indexByName": {name: index for index, name in enumerate(renames)},
                "renameByName": dict(renames),
            },
        )
    )
    if sort_by is not None:
        panel = panel.sort_by(
            [common_builders.TableSortByFieldState().display_name(sort_by).desc(True)]
        )
    for column, column_unit in (column_units or {}).items():
        panel = panel.override_by_name(
            column, [dashboard_models.DynamicConfigValue(id_val="unit", value=column_unit)]
        )
    if colored_column is not None:
        panel = panel.override_by_name(
            colored_column,
            [
                dashboard_models.DynamicConfigValue(
                    id_val="custom.cellOptions", value={"type": "color-background"}
                )
            ],
        )
    return panel


def _variables(single_job: bool) -> list[Any]:
    prometheus_ref = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")
    refresh = dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED
    # Multi-value variables start on "All" (every job / axis / tier).
    everything = dashboard_models.VariableOption(selected=True, text=["All"], value=["$__all"])
    job = (
        dashboard_builders.QueryVariable("job")
        .label("Job")
        .description("Training job (the `job` label the agents report).")
        .datasource(prometheus_ref)
        .query("label_values(mfuscope_steps_total, job)")
        .refresh(refresh)
        .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
    )
    if not single_job:
        job = job.multi(True).include_all(True).all_value(".*").current(everything)

    def collective_label(name: str, label: str, description: str) -> Any:
        """A multi-value variable over a label of the collective series, starting on "All"."""
        return (
            dashboard_builders.QueryVariable(name)
            .label(label)
            .description(description)
            .datasource(prometheus_ref)
            .query(f'label_values(mfuscope_collective_seconds_total{{job=~"$job"}}, {name})')
            .refresh(refresh)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(everything)
            .sort(dashboard_models.VariableSort.ALPHABETICAL_ASC)
        )

    axis = collective_label(
        "axis", "Axis", "Parallelism axis of the process group: tp, dp, pp, ep, cp, ..."
    )
    tier = collective_label(
        "tier",
        "Tier",
        "Interconnect tier: intra_node (NVLink/PCIe) or inter_node (IB/RoCE/Ethernet).",
    )
    datasource = (
        dashboard_builders.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("The Prometheus that scrapes the mfuscope collectors and runs its rules.")
    )
    return [datasource, job, axis, tier]


def build_dashboard(
    uid: str, title: str, description: str, rows: Sequence[Row], *, single_job: bool = False
) -> Any:
    """Assemble a dashboard; panel ids are assigned in layout order, from 1."""
    dashboard = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["mfuscope"])
        .editable()
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .time("now-3h", "now")
        .refresh("30s")
        .timezone("browser")
        .link(
            dashboard_builders.DashboardLink("mfuscope dashboards")
            .type(dashboard_models.DashboardLinkType.DASHBOARDS)
            .tags(["mfuscope"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for variable in _variables(single_job):
        dashboard = dashboard.with_variable(variable)
    panel_id = 0
    for row in rows:
        panel_id += 1
        dashboard = dashboard.with_row(dashboard_builders.Row(row.title).id(panel_id))
        for panel in row.panels:
            panel_id += 1
            dashboard = dashboard.with_panel(panel.id(panel_id))
    return dashboard


def to_json(dashboard: Any) -> str:
    """The dashboard as stable, diff-friendly JSON (sorted keys, two-space indent)."""
    text: str = json.dumps(
        dashboard.build(), cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False
    )
    return text + "\n"
