// Package opscli is the operator's commands of api that do not serve:
// tenants and their keys (api tenant, api key), the dead letters (api
// deadletters), a reaper pass (api reap) and the migrations (api migrate).
// cmd/api's table of commands parses their arguments and calls them.
package opscli
