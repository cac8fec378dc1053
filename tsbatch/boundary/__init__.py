"""The boundary: candidate tables in (schema checks, readers) and result files out (Parquet with provenance)."""
