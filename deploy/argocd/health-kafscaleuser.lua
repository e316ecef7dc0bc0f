-- Argo CD health check for kafscale.io/KafScaleUser.
-- Healthy once the operator has observed the current generation and reports Ready; Degraded
-- when Ready is False for a reason only an edit fixes; Progressing otherwise.
local hs = {}
if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to create the user"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile generation " .. obj.metadata.generation
  return hs
end
local ready = nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    end
  end
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "User ready"
  return hs
end
local permanent = {InvalidSpec = true, InvalidAcl = true, SecretConflict = true}
if ready ~= nil and permanent[ready.reason] then
  hs.status = "Degraded"
  hs.message = ready.reason .. ": " .. (ready.message or "")
  return hs
end
hs.status = "Progressing"
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = "Waiting for the user"
end
return hs
