-- Messages over the row cap are stored capped; the untruncated original is in object storage.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS original_ref jsonb;
