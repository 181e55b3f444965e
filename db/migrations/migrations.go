// Package migrations embeds the golang-migrate files so the binary can
// migrate a database without the source tree. Files are numbered with six
// zero-padded digits: sqlc reads them in text order, golang-migrate in
// numeric order, and padding keeps the two orders the same.
package migrations

import "embed"

// FS holds every *.up.sql and *.down.sql file of this folder.
//
//go:embed *.sql
var FS embed.FS
