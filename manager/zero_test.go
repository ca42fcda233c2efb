package manager_test

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/shmlocks/shmlocks/manager"
)

// The exported methods of Manager without an error result: they return
// zero values on a zero or closed Manager. A new method without an error
// result must be added here (and not panic either).
var managerNoErrorMethods = []string{"Agent", "ClientID", "Fairness", "KeepAliveHeld", "Locker", "Path", "Table"}

// callEvery calls every exported method of recv (found by reflection, so
// that a new method is covered without editing this test) with plain
// arguments, fails the test on a panic, and passes each method's error
// result to checkErr. Callbacks must not run.
func callEvery(t *testing.T, recv any, checkErr func(method string, err error)) (noError []string) {
	t.Helper()
	v := reflect.ValueOf(recv)
	errType := reflect.TypeFor[error]()
	for i := 0; i < v.NumMethod(); i++ {
		meth := v.Type().Method(i)
		ft := meth.Type
		var args []reflect.Value
		for j := 1; j < ft.NumIn(); j++ {
			args = append(args, argFor(t, meth.Name, ft.In(j)))
		}
		out, panicked := func() (out []reflect.Value, p any) {
			defer func() { p = recover() }()
			return v.Method(i).Call(args), nil
		}()
		if panicked != nil {
			t.Errorf("%s panicked: %v", meth.Name, panicked)
			continue
		}
		if n := ft.NumOut(); n > 0 && ft.Out(n-1) == errType {
			err, _ := out[n-1].Interface().(error)
			checkErr(meth.Name, err)
		} else {
			noError = append(noError, meth.Name)
		}
	}
	return noError
}

// argFor makes an argument of type at for method.
func argFor(t *testing.T, method string, at reflect.Type) reflect.Value {
	switch at {
	case reflect.TypeFor[context.Context]():
		return reflect.ValueOf(ctxT(t, eventually))
	case reflect.TypeFor[string]():
		return reflect.ValueOf("a")
	case reflect.TypeFor[[]string]():
		return reflect.ValueOf([]string{"a", "b"})
	case reflect.TypeFor[Mode]():
		return reflect.ValueOf(Exclusive)
	case reflect.TypeFor[RequestOptions]():
		return reflect.ValueOf(RequestOptions{})
	case reflect.TypeFor[int]():
		return reflect.ValueOf(0)
	case reflect.TypeFor[time.Duration]():
		return reflect.ValueOf(time.Duration(0))
	}
	if at.Kind() == reflect.Func {
		return reflect.MakeFunc(at, func([]reflect.Value) []reflect.Value {
			t.Errorf("%s ran its callback", method)
			out := make([]reflect.Value, at.NumOut())
			for i := range out {
				out[i] = reflect.Zero(at.Out(i))
			}
			return out
		})
	}
	t.Fatalf("%s: no argument of type %v: teach argFor", method, at)
	return reflect.Value{}
}

// A zero Manager (never opened) returns an error matching ErrClosed from
// every method that has an error result, and panics in none.
func TestZeroManager(t *testing.T) {
	var m Manager
	noErr := callEvery(t, &m, func(method string, err error) {
		require.ErrorIs(t, err, ErrClosed, "zero Manager: %s", method)
		require.ErrorContains(t, err, "never opened", method)
	})
	slices.Sort(noErr)
	require.Equal(t, managerNoErrorMethods, noErr, "methods without an error result (update managerNoErrorMethods)")
	// Locker's Lock panics with the error, as documented for any failed Acquire.
	func() {
		defer func() {
			err, _ := recover().(error)
			require.ErrorIs(t, err, ErrClosed)
		}()
		m.Locker("a").Lock()
	}()
	require.ErrorIs(t, m.Close(), ErrClosed, "a second Close too")
}

// A closed Manager: the same, ErrClosed from every method with an error
// result (Close itself returns nil, as it is idempotent).
func TestClosedManagerEveryMethod(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	require.NoError(t, m.Close())
	callEvery(t, m, func(method string, err error) {
		if method == "Close" {
			require.NoError(t, err)
			return
		}
		require.ErrorIs(t, err, ErrClosed, "closed Manager: %s", method)
	})
}

// A zero Lock and a nil *Lock hold nothing: no method panics, Release is
// ErrReleased, Lost is closed, and a ctx carrying one carries nothing.
func TestZeroLock(t *testing.T) {
	m := openM(t, tablePath(t), nil)
	for name, l := range map[string]*Lock{"zero": {}, "nil": nil} {
		callEvery(t, l, func(method string, err error) {
			require.ErrorIs(t, err, ErrReleased, "%s Lock: %s", name, method)
		})
		require.True(t, isClosed(l.Lost()), "%s Lock: Lost", name)
		require.Zero(t, l.Reentries())
		require.Zero(t, l.Token())
		c, err := m.Acquire(WithLock(ctxT(t, eventually), l), "", RequestOptions{})
		require.NoError(t, err, "%s Lock in ctx", name)
		require.Equal(t, 1, heldCount(t, m, ""), "a grant of the table")
		require.NoError(t, c.Release())
	}
}
