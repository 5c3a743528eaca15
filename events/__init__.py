"""Chronicle's event contract: schemas, subjects, codec and publisher that agent services import."""
