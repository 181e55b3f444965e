package payments_test

import (
	"testing"

	"github.com/idemref/payments/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }
