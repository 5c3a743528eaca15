-- The load_context call that loaded a skill (skill.loaded v2), so an unload reclaims that output
-- even before its message is stored. reclaimed_outputs.message_id '' means "whichever message
-- carries the tool call".
ALTER TABLE loaded_skills ADD COLUMN IF NOT EXISTS tool_call_id text;
