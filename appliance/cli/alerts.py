"""`appliance alerts`: what needs an operator's eye, until someone acknowledges it."""

from __future__ import annotations

import click

from appliance.cli.base import cli, json_option, print_json
from appliance.cli.connect import connected


@cli.group("alerts", invoke_without_command=True)
@click.option("--all", "everything", is_flag=True, help="acknowledged alerts too")
@json_option
@click.pass_context
def alerts_group(ctx: click.Context, everything: bool, as_json: bool) -> None:
    """Drift, failed jobs, rolled-back canaries, an audit log that does not verify: open ones, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    with connected() as appliance:
        found = appliance.alerts(acknowledged=everything)
    if as_json:
        print_json(found)
        return
    if not found:
        click.echo("no open alerts" if not everything else "no alerts yet")
    for alert in found:
        times = f" (x{alert['count']}, last {alert['last_at'][:19]})" if alert["count"] > 1 else ""
        seen = f"  acknowledged by {alert['acknowledged_by']}" if alert["acknowledged_at"] else ""
        click.echo(f"{alert['id']:>4}  {alert['raised_at'][:19]}  {alert['severity']:<7}  {alert['source']:<9}"
                   f" {alert['message']}{times}{seen}")
    if any(not alert["acknowledged_at"] for alert in found):
        click.echo("'appliance alerts ack ID' marks one as seen")


@alerts_group.command("ack")
@click.argument("alert_ids", nargs=-1, required=True, type=click.IntRange(min=1))
def alerts_ack(alert_ids: tuple[int, ...]) -> None:
    """Mark alerts as seen (on the record, as you): they leave the open list."""
    with connected() as appliance:
        for alert_id in alert_ids:
            alert = appliance.acknowledge(alert_id)
            click.echo(f"alert {alert_id} acknowledged ({alert['source']}: {alert['subject']})")
