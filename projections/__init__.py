"""Read models materialised from the event log, and the queries that serve them."""
