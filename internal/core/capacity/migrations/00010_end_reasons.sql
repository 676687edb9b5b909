-- Why a reservation ended, for reservations.get and list: released, cancelled, expired,
-- preempted (ended_by: the reservation that took its capacity) or drained (ended_by: the node
-- drained with end: true). A live reservation's end_reason stays what it was: NULL, or
-- 'preempted' decided ahead for a future end. A trigger fills the reason from the state it
-- ends in, so that every path that ends a reservation records it, and a path that knows more
-- (a drain) overwrites it in the same transaction.

-- +goose Up
ALTER TABLE compute.reservations
  DROP CONSTRAINT reservations_end_reason_check,
  ADD CONSTRAINT reservations_end_reason_check CHECK (end_reason IN ('released', 'cancelled', 'expired', 'preempted', 'drained')),
  ADD COLUMN ended_by text CHECK (length(ended_by) <= 128);

UPDATE compute.reservations SET end_reason = state WHERE state IN ('released', 'cancelled', 'expired', 'preempted');

-- +goose StatementBegin
CREATE FUNCTION compute.reservation_end_reason() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state IS DISTINCT FROM OLD.state AND NEW.state IN ('released', 'cancelled', 'expired', 'preempted') THEN
    NEW.end_reason := NEW.state;
    IF NEW.state <> 'preempted' THEN
      NEW.ended_by := NULL;
    END IF;
  END IF;
  RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER reservation_end_reason BEFORE UPDATE OF state ON compute.reservations
  FOR EACH ROW EXECUTE FUNCTION compute.reservation_end_reason();

-- +goose Down
DROP TRIGGER reservation_end_reason ON compute.reservations;
DROP FUNCTION compute.reservation_end_reason();
UPDATE compute.reservations SET end_reason = NULL WHERE end_reason IS DISTINCT FROM 'preempted';
ALTER TABLE compute.reservations
  DROP COLUMN ended_by,
  DROP CONSTRAINT reservations_end_reason_check,
  ADD CONSTRAINT reservations_end_reason_check CHECK (end_reason IN ('preempted'));
