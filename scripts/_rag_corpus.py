"""The six short personal documents (e-mail-like notes on six topics) that the RAG HTTP scripts
ingest (`rag_http_levels.py`, `rag_http_idle.py`); not a script itself."""

TOPICS = [
    ("budget", "Alice", "The budget review moved to Thursday at 3 pm in room Fjord. Bring the Q1 forecast and the hiring plan. Carol joins remotely from Oslo and will present the travel costs."),
    ("offsite", "Bob", "The team offsite is in Porto from May 4 to May 6. Flights leave Lisbon at noon. Hotel Ribeira is booked for everyone and the dinner is on the second evening."),
    ("release", "Dana", "We agreed to ship the cache tier in June. Dana owns the disk format, Eli writes the benchmark, and the next design sync is on Tuesday morning."),
    ("dentist", "Clinic", "Dentist appointment on Monday at 8 am at the Smile Clinic. Call the garage about the car before noon and pick up the parcel at the post office."),
    ("hiring", "Frank", "Frank scheduled three interviews for the backend role next Wednesday. The take-home task is due Friday and the panel is Frank, Grace and Heidi."),
    ("launch", "Grace", "The product launch webinar is on the 14th at 5 pm. Grace prepares the slides, marketing sends the invitations and support staffs the chat."),
]

# Each document is its note written twice.
DOCS = [{"id": f"{t}-{i}", "type": "txt", "text": f"From: {who}. Subject: {t}. {body} " * 2} for i, (t, who, body) in enumerate(TOPICS)]
