DROP TRIGGER processed_messages_move_horizon ON processed_messages;
DROP FUNCTION processed_messages_move_horizon();
DROP TABLE processed_messages_horizon;
