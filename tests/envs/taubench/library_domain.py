"""A τ-bench-style domain made up for the tests: a lending library with members, books and loans.

It is all a new domain needs: a data folder (`library/`), three tool functions and an expert.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

from sessionrl.envs import ExpertPlan, Task
from sessionrl.envs.taubench import Json, PlanBuilder, TauDb, TauEnv, final_message, tool
from sessionrl.skills import SkillError

DATA = Path(__file__).parent / "library"
"""The library's data folder."""

NOT_FOUND = "NOT_FOUND"
UNAVAILABLE = "UNAVAILABLE"


@tool(errors=(NOT_FOUND,))
def find_member(db: TauDb, email: str) -> Json:
    """The id of the member with this email."""
    for member_id, member in db.items("members"):
        if member["email"] == email.strip().lower():
            return {"member_id": member_id}
    raise SkillError(NOT_FOUND, f"no member with email {email!r}")


@tool(errors=(NOT_FOUND,))
def get_book(db: TauDb, book_id: str) -> Json:
    """The book's record."""
    book = db.get("books", book_id)
    if book is None:
        raise SkillError(NOT_FOUND, f"no book {book_id!r}")
    return dict(book)


@tool(errors=(NOT_FOUND, UNAVAILABLE), writes=True)
def borrow_book(db: TauDb, member_id: str, book_id: str) -> Json:
    """Lend a copy of a book to a member: a new loan record, one copy fewer on the shelf."""
    if db.get("members", member_id) is None:
        raise SkillError(NOT_FOUND, f"no member {member_id!r}")
    book = get_book(db, book_id=book_id)
    loan_id = f"{member_id}/{book_id}"
    if book["copies"] < 1 or db.get("loans", loan_id) is not None:
        raise SkillError(UNAVAILABLE, f"{book['title']} cannot be lent to {member_id} now")
    db.edit("books", book_id)["copies"] -= 1
    return db.insert("loans", loan_id, {"member_id": member_id, "book_id": book_id})


class LibraryEnv(TauEnv):
    """The lending library over a data folder (`DATA` ships with the tests)."""

    name = "library"
    tables = ("members", "books", "loans")
    tools = (find_member, get_book, borrow_book)
    errors: ClassVar[dict[str, str]] = {
        NOT_FOUND: "No such member or book.",
        UNAVAILABLE: "No copy of the book can be lent to the member now.",
    }

    def expert(self, task: Task) -> ExpertPlan:
        """Find the member by the email in the instruction, look at each book, then lend it."""
        plan = PlanBuilder(self.fresh_db(), self.toolbox)
        email = re.search(r"[\w.]+@[\w.]+\w", task.instruction)
        found = plan.add("find the member", "find_member", {"email": email.group() if email else ""})
        done: list[str] = []
        failed: list[str] = []
        for action in task.payload["actions"]:
            book_id = action["kwargs"]["book_id"]
            read = plan.read(book_id, f"look at book {book_id}", "get_book", {"book_id": book_id}, [found])
            _, error = plan.act(action, f"lend book {book_id}", [found, read])
            if error is None:
                done.append(f"lent you book {book_id}")
            else:
                failed.append(f"I could not lend you book {book_id} ({error.message})")
        return plan.plan("lend the books asked for", final_message(done, failed, task.payload["outputs"]))
