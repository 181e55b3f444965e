package validation

import "github.com/google/uuid"

// IDMessage is what an id in another form is told.
const IDMessage = "must be a UUID in its canonical form: 36 characters, lower-case hex digits and hyphens, such as 01890a5d-ac96-774b-bcce-b302099a8057"

// ParseID parses an id of this API. Every id is a UUID in the one form the
// API writes: 36 characters, lower-case hex digits with hyphens after the
// 8th, 12th, 16th and 20th digit. uuid.Parse also takes upper case,
// {...}, urn:uuid:... and the 32 digits without hyphens: one id spelt
// several ways would be several names for one resource, in paths, logs,
// cursors and fingerprints. Every id a request carries, in its path, its
// query or its body, is read through ParseID.
func ParseID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.Nil, false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return uuid.Nil, false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return uuid.Nil, false
			}
		}
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}
