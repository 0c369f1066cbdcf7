# Regenerate wire types: needs protoc (Debian: protobuf-compiler) and the pinned
# protoc-gen-go; scripts/install-tools installs both.
PROTOC_GEN_GO_VERSION := v1.36.12

.PHONY: proto test tools
proto:
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	protoc --proto_path=proto --go_out=. --go_opt=module=github.com/phalanx-rt/phalanx proto/phalanx/v1/*.proto

test:
	bash scripts/test

tools:
	bash scripts/install-tools
