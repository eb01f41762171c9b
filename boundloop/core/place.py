"""Where a run is in an agent tree (boundloop.core.tree): plain data, carried in a
child run's input and state."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TreePlace(BaseModel):
    """Where a child run is in its tree: the root run's workflow id, the workflow id of
    the run that started it and the sub-agent names from the root down to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: str
    parent: str
    path: list[str] = Field(min_length=1)

    @property
    def depth(self) -> int:
        return len(self.path)

    def line(self, *tail: str) -> str:
        """`root → researcher → create_ticket`, as people read it."""
        return " → ".join([self.root, *self.path, *tail])


def child_place(place: TreePlace | None, workflow_id: str, name: str) -> TreePlace:
    """The place of a child named `name` of the run `workflow_id` at `place`."""
    if place is None:
        return TreePlace(root=workflow_id, parent=workflow_id, path=[name])
    return TreePlace(root=place.root, parent=workflow_id, path=[*place.path, name])
