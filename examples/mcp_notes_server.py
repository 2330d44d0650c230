"""A small stateful MCP server: a notes store kept in SQLite.

It is the server the MCP•RL example trains against, and the one the tests start over
stdio and streamable HTTP. Tools add, find, read, tag and delete notes; a resource
reports how many notes there are.

    python examples/mcp_notes_server.py --db notes.db                  # stdio
    python examples/mcp_notes_server.py --db notes.db --http --port 8765  # http://127.0.0.1:8765/mcp
    python examples/mcp_notes_server.py --db :memory:                 # a fresh store per process

With `--db :memory:` each server process starts from the seed notes, which is what
`MCPRolloutConfig(fresh_sessions=True)` needs to start every rollout from one state.
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

SEED_NOTES = [
    ("Groceries", "Buy milk, eggs, rice and two lemons.", "home"),
    ("Dentist", "Appointment on Tuesday at 10:30 with Dr. Park.", "health"),
    ("Project kickoff", "Kickoff meeting with the design team on Monday.", "work"),
    ("Book list", "Read 'The Left Hand of Darkness' next.", "home"),
]


def open_store(path: str) -> sqlite3.Connection:
    """Open (and on first use create and seed) the notes database at `path`."""
    connection = sqlite3.connect(path, check_same_thread=False)
    connection.execute(
        "CREATE TABLE IF NOT EXISTS notes ("
        "id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL, tag TEXT NOT NULL)"
    )
    if connection.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 0:
        connection.executemany("INSERT INTO notes (title, body, tag) VALUES (?, ?, ?)", SEED_NOTES)
    connection.commit()
    return connection


# --8<-- [start:server]
def build_server(db_path: str) -> MCPServer:
    """The notes server over the database at `db_path`."""
    store = open_store(db_path)
    # The tools are coroutines so that they run on the server's event loop, one at a time:
    # sync tools run in worker threads, where two concurrent inserts on this one connection
    # could each read the other's `lastrowid`.
    server = MCPServer(
        "notes", instructions="A notes store: add, search, read and tag notes.", log_level="WARNING"
    )

    @server.tool()
    async def add_note(title: str, body: str, tag: str = "general") -> str:
        """Add a note and return its id."""
        if not title.strip():
            raise ToolError("title is empty; give the note a short title")
        cursor = store.execute(
            "INSERT INTO notes (title, body, tag) VALUES (?, ?, ?)", (title, body, tag)
        )
        store.commit()
        return f"added note {cursor.lastrowid}"

    # --8<-- [end:server]

    @server.tool()
    async def list_notes(tag: str | None = None) -> str:
        """List the notes (id and title), optionally only those with `tag`."""
        rows = (
            store.execute("SELECT id, title, tag FROM notes WHERE tag = ?", (tag,))
            if tag
            else store.execute("SELECT id, title, tag FROM notes")
        ).fetchall()
        if not rows:
            return "no notes"
        return "\n".join(f"{id_}: {title} [{tag_}]" for id_, title, tag_ in rows)

    @server.tool()
    async def search_notes(query: str) -> str:
        """Find notes whose title or body contains `query` (case-insensitive)."""
        pattern = f"%{query}%"
        rows = store.execute(
            "SELECT id, title FROM notes WHERE title LIKE ? OR body LIKE ?", (pattern, pattern)
        ).fetchall()
        return "\n".join(f"{id_}: {title}" for id_, title in rows) or f"no note mentions {query!r}"

    @server.tool()
    async def read_note(note_id: int) -> str:
        """Return the full text of note `note_id`."""
        row = store.execute(
            "SELECT title, body, tag FROM notes WHERE id = ?", (note_id,)
        ).fetchone()
        if row is None:
            raise ToolError(f"there is no note {note_id}; call list_notes to see the ids")
        title, body, tag = row
        return f"{title} [{tag}]\n{body}"

    @server.tool()
    async def delete_note(note_id: int) -> str:
        """Delete note `note_id`."""
        if store.execute("DELETE FROM notes WHERE id = ?", (note_id,)).rowcount == 0:
            raise ToolError(f"there is no note {note_id}; call list_notes to see the ids")
        store.commit()
        return f"deleted note {note_id}"

    @server.resource("notes://stats", description="How many notes there are, per tag.")
    async def stats() -> str:
        rows = store.execute("SELECT tag, COUNT(*) FROM notes GROUP BY tag ORDER BY tag").fetchall()
        return "\n".join(f"{tag}: {count}" for tag, count in rows) or "no notes"

    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db",
        default="notes.db",
        help="SQLite file (created and seeded if new); ':memory:' for a store per process",
    )
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--port", type=int, default=8765)
    arguments = parser.parse_args()
    server = build_server(str(Path(arguments.db)))
    if arguments.http:
        server.run("streamable-http", host="127.0.0.1", port=arguments.port)
    else:
        server.run("stdio")
