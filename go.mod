module github.com/phalanx-rt/phalanx

go 1.26

require (
	go.uber.org/zap v1.28.0
	gonum.org/v1/gonum v0.17.0
	google.golang.org/protobuf v1.36.12
)

require go.uber.org/multierr v1.10.0 // indirect
